package egress

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"time"
)

// maxLooked bounds the answers of Config.Lookup kept at once.
const maxLooked = 4096

// looked is one answer of Config.Lookup.
type looked struct {
	ws Workspace
	ok bool // live
	at time.Time
}

// derive is the credential of workspace id under Config.CredentialKey.
func (p *Proxy) derive(id string) string {
	m := hmac.New(sha256.New, p.cfg.CredentialKey)
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// authenticateDerived checks pass against the credential derived for id
// and asks Config.Lookup (or its recent answer) whether id is live.
func (p *Proxy) authenticateDerived(ctx context.Context, id, pass string) (Workspace, *wsState, *denial) {
	if !hmac.Equal([]byte(pass), []byte(p.derive(id))) || p.cfg.Lookup == nil {
		return Workspace{}, nil, deny(ReasonAuth, http.StatusProxyAuthRequired)
	}
	now := time.Now()
	p.mu.Lock()
	l, cached := p.lookup[id]
	p.mu.Unlock()
	if !cached || now.Sub(l.at) >= p.cfg.LookupTTL {
		ws, ok, err := p.cfg.Lookup(ctx, id)
		if err != nil {
			// The store is out of reach: not the credential's fault, and
			// not remembered, so the next request asks again.
			return Workspace{}, nil, deny(ReasonAuth, http.StatusServiceUnavailable)
		}
		if ok && (ws.ID != id || ws.Validate() != nil) {
			ok = false
		}
		l = looked{ws: ws, ok: ok, at: now}
		p.mu.Lock()
		if _, registered := p.creds[id]; !registered {
			p.remember(id, l)
		}
		p.mu.Unlock()
	}
	if !l.ok {
		return Workspace{}, nil, deny(ReasonAuth, http.StatusProxyAuthRequired)
	}
	st := p.workspace(l.ws)
	p.mu.Lock()
	st.remote = true
	p.mu.Unlock()
	return l.ws, st, nil
}

// remember keeps l as the answer for id, dropping expired answers (and,
// if none has expired, an arbitrary one) to stay within maxLooked. p.mu
// must be held.
func (p *Proxy) remember(id string, l looked) {
	if _, ok := p.lookup[id]; !ok && len(p.lookup) >= maxLooked {
		for k, v := range p.lookup {
			if l.at.Sub(v.at) >= p.cfg.LookupTTL {
				delete(p.lookup, k)
			}
		}
		for k := range p.lookup {
			if len(p.lookup) < maxLooked {
				break
			}
			delete(p.lookup, k)
		}
	}
	p.lookup[id] = l
}
