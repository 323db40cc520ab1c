// Package egress is the broker's domain-allowlist egress proxy: HTTP
// CONNECT and plain-HTTP forwarding to the domains and ports a workspace
// was admitted with, and nothing else. docs/egress.md has the threat model
// and how each threat is stopped.
package egress

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sandgate/sandgate/policy"
)

// The proxy's metrics.
const (
	// MetricDenied counts refused proxy requests, by reason (AttrReason).
	MetricDenied = "sandgate.egress.denied"
	// MetricBytes counts the bytes moved to and from destinations, by
	// direction (AttrDirection: "out" is sandbox to destination, "in" the
	// reverse).
	MetricBytes = "sandgate.egress.bytes"
	// AttrReason is the attribute of MetricDenied.
	AttrReason = "reason"
	// AttrDirection is the attribute of MetricBytes.
	AttrDirection = "direction"
)

// Reasons of a refusal, the values of AttrReason and of the "reason" log
// attribute.
const (
	ReasonBadRequest = "bad_request" // not a proxy request, or a malformed one
	ReasonAuth       = "auth"        // credential mode: no or a wrong credential
	ReasonIPLiteral  = "ip_literal"  // the destination is an address, not a name
	ReasonDomain     = "domain"      // the name is not in the workspace's allowed_domains
	ReasonPort       = "port"        // the port is not in Config.Ports
	ReasonAddress    = "address"     // the name resolves only to refused addresses
	ReasonSNI        = "sni"         // the TLS ClientHello names another host, or none
	ReasonNotTLS     = "not_tls"     // a tunnel to a TLS port that does not start with a ClientHello
	ReasonLimit      = "limit"       // the workspace has MaxConnsPerWorkspace connections open
	ReasonResolve    = "resolve"     // the name does not resolve
	ReasonUnreached  = "unreachable" // no checked address answered
)

// Config configures a [Proxy]. A zero field means the default noted beside it.
type Config struct {
	// Ports are the destination ports a workspace may reach; nil means
	// 80 and 443.
	Ports []uint16
	// TLSPorts are the ports on which a CONNECT tunnel must start with a
	// TLS ClientHello; nil means 443. On every port, a tunnel that starts
	// with a ClientHello must name the CONNECT host in its SNI.
	TLSPorts []uint16
	// Hosts are the operator's static hosts (on-premises mirrors, tests):
	// these names are looked up here and nowhere else, and their addresses
	// are exempt from the private-address refusal. Names are lowercase
	// hostnames in the allowed_domains grammar, without wildcards.
	Hosts map[string]netip.Addr
	// MaxConnsPerWorkspace bounds the connections of one workspace open
	// at once, counted apart: the ones to its listener ([Proxy.Serve]; more
	// are closed as they arrive) and the ones to destinations (more are
	// refused with 429); 0 means 64.
	MaxConnsPerWorkspace int
	// MaxSharedConns bounds the connections to ServeShared's listener
	// open at once that no request has yet attributed to a workspace
	// (each of them then counts in its workspace's
	// MaxConnsPerWorkspace); 0 means 1024.
	MaxSharedConns int
	// IdleTimeout closes a connection that moved no byte in either
	// direction for this long; 0 means 5 minutes.
	IdleTimeout time.Duration
	// HeaderTimeout bounds reading a request's header; 0 means 30s.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request's header, and a response's header
	// in plain-HTTP forwarding; 0 means 16 KiB.
	MaxHeaderBytes int
	// DialTimeout bounds resolving and connecting to a destination; 0
	// means 30s.
	DialTimeout time.Duration
	// Meter makes MetricDenied and MetricBytes; nil means no metrics.
	Meter metric.Meter
	// Resolver looks up the names not in Hosts; nil means net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// Dial connects to the checked address (always an IP address and a
	// port); nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// CredentialKey, when set, makes every credential of Register the
	// HMAC-SHA256 of the workspace id under it, so that every proxy with
	// the same key (the other gateways of one store, this one after a
	// restart) can check it without having registered the workspace. At
	// least 16 bytes; nil means random credentials, known only here.
	CredentialKey []byte
	// Lookup finds a workspace ServeShared was not told of by Register,
	// once its credential checked out under CredentialKey: ok is false
	// when the workspace is not live (unknown, terminating or
	// terminated). Nil means such a workspace is refused.
	Lookup func(ctx context.Context, id string) (ws Workspace, ok bool, err error)
	// LookupTTL is how long an answer of Lookup is reused, so a busy
	// tunnel does not ask per request; a workspace ended elsewhere is
	// refused here at most this long after; 0 means 5s.
	LookupTTL time.Duration
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Ports == nil {
		c.Ports = []uint16{80, 443}
	}
	if c.TLSPorts == nil {
		c.TLSPorts = []uint16{443}
	}
	if c.MaxConnsPerWorkspace == 0 {
		c.MaxConnsPerWorkspace = 64
	}
	if c.MaxSharedConns == 0 {
		c.MaxSharedConns = 1024
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.HeaderTimeout == 0 {
		c.HeaderTimeout = 30 * time.Second
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = 16 << 10
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 30 * time.Second
	}
	if c.Meter == nil {
		c.Meter = noop.NewMeterProvider().Meter("")
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.Dial == nil {
		c.Dial = (&net.Dialer{}).DialContext
	}
	if c.LookupTTL == 0 {
		c.LookupTTL = 5 * time.Second
	}
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	if slices.Contains(c.Ports, 0) || slices.Contains(c.TLSPorts, 0) {
		return errors.New("egress: port 0 is not a destination port")
	}
	for name, a := range c.Hosts {
		if _, err := policy.ParseDomain(name); err != nil || strings.HasPrefix(name, "*.") {
			return fmt.Errorf("egress: hosts: %q is not a lowercase host name (as in mirror.example.com)", name)
		}
		if !a.IsValid() || a.Zone() != "" {
			return fmt.Errorf("egress: hosts: %s: not a valid IP address", name)
		}
	}
	if c.MaxConnsPerWorkspace < 0 || c.MaxSharedConns < 0 || c.IdleTimeout < 0 || c.HeaderTimeout < 0 ||
		c.MaxHeaderBytes < 0 || c.DialTimeout < 0 || c.LookupTTL < 0 {
		return errors.New("egress: limits and timeouts must not be negative")
	}
	if c.CredentialKey != nil && len(c.CredentialKey) < 16 {
		return errors.New("egress: the credential key must be at least 16 bytes")
	}
	if c.Lookup != nil && c.CredentialKey == nil {
		return errors.New("egress: a lookup needs a credential key")
	}
	return nil
}

// Workspace is what the proxy knows of one workspace.
type Workspace struct {
	// ID is the workspace id, for counters and logs.
	ID string
	// AccountID is the workspace's account: with it, the bytes counted are
	// handed to [Proxy.Record] as they come, not only at the end; "" (a
	// workspace made before it was known) keeps them for [Proxy.Forget].
	AccountID string
	// AllowedDomains are the admitted domains in the protocol's grammar
	// (an exact name, or "*." and a name for its subdomains, not the name
	// itself); nil or empty reaches nothing.
	AllowedDomains []string
}

// Validate reports an entry of AllowedDomains outside the protocol's
// grammar (the gateway admits none; the proxy checks again rather than
// read "*" or "*.com" some other way).
func (w Workspace) Validate() error {
	if w.ID == "" {
		return errors.New("egress: a workspace needs an id")
	}
	for i, d := range w.AllowedDomains {
		if _, err := policy.ParseDomain(d); err != nil {
			return fmt.Errorf("egress: workspace %s: allowed_domains[%d]: %w", w.ID, i, err)
		}
	}
	return nil
}

// Allows reports whether host (lowercase, no trailing dot) matches one of
// the workspace's allowed domains.
func (w Workspace) Allows(host string) bool {
	for _, d := range w.AllowedDomains {
		if parent, ok := strings.CutPrefix(d, "*."); ok {
			if len(host) > len(parent)+1 && strings.HasSuffix(host, parent) && host[len(host)-len(parent)-1] == '.' {
				return true
			}
		} else if host == d {
			return true
		}
	}
	return false
}

// Usage is the bytes a workspace moved through the proxy.
type Usage struct {
	BytesOut int64 // sandbox -> destination
	BytesIn  int64 // destination -> sandbox
}

// Proxy is the egress proxy. Its methods are safe for concurrent use.
type Proxy struct {
	cfg    Config
	ports  map[uint16]bool
	tls    map[uint16]bool
	log    *slog.Logger
	denied metric.Int64Counter
	bytes  metric.Int64Counter

	// recordMu is held by Record from reading the counts to counting what
	// was kept, and by Forget: an end never misses bytes a Record has
	// in flight, nor counts them twice.
	recordMu sync.Mutex

	// id is this proxy's, random, in each of its counters' names.
	id string

	mu     sync.Mutex
	made   uint64                  // wsStates made so far
	state  map[string]*wsState     // by workspace id
	creds  map[string]registration // credential mode, by workspace id
	lookup map[string]looked       // Config.Lookup's recent answers, by workspace id
}

// wsState is the counters of one workspace.
type wsState struct {
	out, in atomic.Int64
	conns   atomic.Int64 // open connections to destinations
	account string       // the workspace's account ("": not known); guarded by Proxy.mu
	// counter names this count of the workspace where its bytes are kept
	// ([Delta]): the proxy's id and a number no other wsState of the
	// proxy had, so a count begun again never takes an older one's name.
	counter string
	// kept is what a Record saw kept of the counts; inDoubt is set when
	// one was sent and its fate is not known (an error, a lost reply), and
	// kept may then be short. Both guarded by Proxy.recordMu.
	kept    Usage
	inDoubt bool
	// remote is set for a workspace found by Config.Lookup: its end is
	// seen elsewhere, so Record sends its count until it hears KeptEnded.
	remote bool
}

// total is every byte s counted.
func (s *wsState) total() Usage { return Usage{BytesOut: s.out.Load(), BytesIn: s.in.Load()} }

// registration is one workspace of credential mode.
type registration struct {
	ws   Workspace
	cred []byte
}

// Deps are what a Proxy works with.
type Deps struct {
	// Log logs refusals: the workspace id, the destination's host and
	// port and the reason, never a path, header or body; nil discards.
	Log *slog.Logger
}

// New returns a proxy for cfg, defaults filled in.
func New(cfg Config, d Deps) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, ports: map[uint16]bool{}, tls: map[uint16]bool{}, log: d.Log, id: rand.Text()[:16],
		state: map[string]*wsState{}, creds: map[string]registration{}, lookup: map[string]looked{}}
	for _, port := range cfg.Ports {
		p.ports[port] = true
	}
	for _, port := range cfg.TLSPorts {
		p.tls[port] = true
	}
	var err error
	if p.denied, err = cfg.Meter.Int64Counter(MetricDenied, metric.WithUnit("{request}"),
		metric.WithDescription("Egress proxy requests refused, by reason.")); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	// Every reason's series exists from the start, at 0: a rate over it,
	// and an alert on its increase, sees the first refusal.
	for _, r := range []string{ReasonBadRequest, ReasonAuth, ReasonIPLiteral, ReasonDomain, ReasonPort, ReasonAddress, ReasonSNI,
		ReasonNotTLS, ReasonLimit, ReasonResolve, ReasonUnreached} {
		p.denied.Add(context.Background(), 0, metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrReason, r))))
	}
	if p.bytes, err = cfg.Meter.Int64Counter(MetricBytes, metric.WithUnit("By"),
		metric.WithDescription("Bytes moved through the egress proxy, by direction: out (sandbox to destination) or in.")); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	p.bytes.Add(context.Background(), 0, dirIn)
	p.bytes.Add(context.Background(), 0, dirOut)
	return p, nil
}

// workspace returns the counters of ws, made on first use.
func (p *Proxy) workspace(ws Workspace) *wsState {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state[ws.ID]
	if s == nil {
		p.made++
		s = &wsState{counter: p.id + "." + strconv.FormatUint(p.made, 10)}
		p.state[ws.ID] = s
	}
	if ws.AccountID != "" {
		s.account = ws.AccountID
	}
	return s
}

// Usage returns the bytes workspace id moved so far: zero for a workspace
// the proxy has not seen.
func (p *Proxy) Usage(id string) Usage {
	p.mu.Lock()
	s := p.state[id]
	p.mu.Unlock()
	if s == nil {
		return Usage{}
	}
	return Usage{BytesOut: s.out.Load(), BytesIn: s.in.Load()}
}

// Count is a workspace's count at its end ([Proxy.Forget]).
type Count struct {
	// Counter names the count where it is kept ([Delta]); "" when the
	// proxy never saw the workspace.
	Counter string
	// Total is every byte counted; Kept, what of it a Record saw kept.
	Total, Kept Usage
	// Exact is false when a Record's fate is not known: more than Kept may
	// be kept. Whoever keeps Total then must add only what is not kept
	// already, by Counter.
	Exact bool
}

// Unkept is what of c was not kept when last seen: what c adds to what
// is kept, when c is exact.
func (c Count) Unkept() Usage {
	return Usage{BytesOut: c.Total.BytesOut - c.Kept.BytesOut, BytesIn: c.Total.BytesIn - c.Kept.BytesIn}
}

// Forget returns the final count of workspace id and drops its counters.
// Call it once the workspace's listener is closed and its Serve returned
// (or after Unregister): bytes moved afterwards are not counted. A Record
// in flight finishes first, so Kept includes what it kept.
func (p *Proxy) Forget(id string) Count {
	p.recordMu.Lock()
	defer p.recordMu.Unlock()
	p.mu.Lock()
	s := p.state[id]
	delete(p.state, id)
	p.mu.Unlock()
	if s == nil {
		return Count{Exact: true}
	}
	return Count{Counter: s.counter, Total: s.total(), Kept: s.kept, Exact: !s.inDoubt}
}

// Delta is one workspace's count, handed to Record's keep: every byte
// counted under Counter so far (Usage), not only what is new since the
// last Record. Keeping it must add to what is kept under Counter only
// what exceeds it, so that a Delta kept twice (a retry, a reply lost
// after the write) is kept once.
type Delta struct {
	WorkspaceID, AccountID string
	Counter                string
	Usage
}

// Kept is what became of a [Delta] handed to Record's keep.
type Kept int

const (
	// NotKept: not kept (the workspace is ending); the bytes stay counted
	// here, for Forget.
	NotKept Kept = iota
	// KeptAll: kept.
	KeptAll
	// KeptEnded: the workspace has ended; its counters are dropped.
	KeptEnded
	// KeptInDoubt: the keep failed, or may have: the next Record sends
	// the count again.
	KeptInDoubt
)

// Record hands keep the count of each workspace of a known account that
// has counted more than was last kept, or whose last keep is in doubt.
// The broker keeps them on each workspace's record every few seconds, so
// that a broker process that stops (a restart, a crash) loses at most
// what it counted since, and a workspace ended by another process still
// has them on its usage entry. keep returns one Kept for each Delta, in
// order, or an error (every keep in doubt).
func (p *Proxy) Record(ctx context.Context, keep func(context.Context, []Delta) ([]Kept, error)) error {
	p.recordMu.Lock()
	defer p.recordMu.Unlock()
	var ds []Delta
	var sts []*wsState
	p.mu.Lock()
	for id, s := range p.state {
		t := s.total()
		if s.account == "" || (t == s.kept && !s.inDoubt && !s.remote) {
			continue
		}
		ds = append(ds, Delta{WorkspaceID: id, AccountID: s.account, Counter: s.counter, Usage: t})
		sts = append(sts, s)
	}
	p.mu.Unlock()
	if len(ds) == 0 {
		return nil
	}
	kept, err := keep(ctx, ds)
	if err == nil && len(kept) != len(ds) {
		err = fmt.Errorf("egress: record: %d answers for %d workspaces", len(kept), len(ds))
	}
	if err != nil {
		for _, s := range sts {
			s.inDoubt = true
		}
		return err
	}
	for i, s := range sts {
		switch kept[i] {
		case KeptAll:
			s.kept, s.inDoubt = ds[i].Usage, false
		case KeptInDoubt:
			s.inDoubt = true
		case KeptEnded:
			p.mu.Lock()
			if p.state[ds[i].WorkspaceID] == s {
				delete(p.state, ds[i].WorkspaceID)
			}
			p.mu.Unlock()
		}
	}
	return nil
}
