package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/conformance"
	"github.com/sandgate/sandgate/openapi"
	"github.com/sandgate/sandgate/openapi/openapitest"
	"github.com/sandgate/sandgate/protocol"
)

// wantConformance runs `sandgate conformance` with env and args and
// requires exit 0 and an ok line for every check, the egress ones only
// when egress is set (skipped otherwise).
func wantConformance(t *testing.T, egress bool, env []string, args ...string) {
	t.Helper()
	stdout, stderr, err := tryCLI(env, append([]string{"conformance"}, args...)...)
	if err != nil {
		t.Fatalf("sandgate conformance: %v\n%s%s", err, stdout, stderr)
	}
	for _, name := range conformance.Checks {
		want := "ok    " + name + " "
		if !egress && strings.HasPrefix(name, "egress-") {
			want = "skip  " + name + ": "
		}
		if !strings.Contains(stdout, "\n"+want) && !strings.HasPrefix(stdout, want) {
			t.Errorf("sandgate conformance printed no %q line:\n%s", strings.TrimSpace(want), stdout)
		}
	}
}

// TestConformanceDev: `sandgate conformance` passes against `sandgate dev`
// with the variables of its dev.env; and every answer of the same checks,
// run in-process, matches openapi/v1.json: each of its operations is
// answered at least once, each answer's status is documented for the
// operation and its body matches the schema (the refusals' codes
// included).
func TestConformanceDev(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	wantConformance(t, false, []string{"BROKER_URL=" + d.URL, "BROKER_TOKEN=" + d.Token, "BROKER_CA=" + d.CAPath})

	spec, err := openapitest.Load(openapi.V1)
	if err != nil {
		t.Fatal(err)
	}
	rec := &validating{spec: spec, next: httpsClient(d.Roots).Transport, seen: map[string][]int{}}
	results, err := conformance.Run(context.Background(), conformance.Config{URL: d.URL, Token: sandgate.Secret(d.Token),
		HTTPClient: &http.Client{Transport: rec}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if !r.OK && !r.Skipped {
			t.Errorf("check %s failed: %s", r.Name, r.Error)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.errs {
		t.Errorf("an answer departs from openapi/v1.json: %v", e)
	}
	for route := range spec.Operations() {
		if len(rec.seen[route]) == 0 {
			t.Errorf("no answer of %s was validated", route)
		}
	}
	var refusals []int
	for _, sts := range rec.seen {
		for _, s := range sts {
			if s >= 400 && !slices.Contains(refusals, s) {
				refusals = append(refusals, s)
			}
		}
	}
	slices.Sort(refusals)
	if want := []int{400, 401, 404, 409, 410, 422}; !slices.Equal(refusals, want) {
		t.Errorf("validated refusals of statuses %v; want %v", refusals, want)
	}
}

// validating is a RoundTripper that checks every answer against the
// document and records the operation and status it answered.
type validating struct {
	spec *openapitest.Spec
	next http.RoundTripper

	mu   sync.Mutex
	seen map[string][]int // by "METHOD /template"
	errs []error
}

func (v *validating) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := v.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	cerr := v.spec.CheckResponse(req.Method, req.URL.Path, resp.StatusCode, resp.Header, body)
	v.mu.Lock()
	defer v.mu.Unlock()
	if cerr != nil {
		v.errs = append(v.errs, cerr)
	}
	if _, tmpl, ok := v.spec.Operation(req.Method, req.URL.Path); ok {
		route := req.Method + " " + tmpl
		v.seen[route] = append(v.seen[route], resp.StatusCode)
	}
	return resp, nil
}

// conformanceSlots bounds the providers' conformance runs that go at
// once: each is a broker, a Redis and often a vendor fake.
var conformanceSlots = make(chan struct{}, 2)

// TestConformanceServe: `sandgate conformance` passes against `sandgate
// serve` on every provider (local, and Modal, Fly Machines and Fly Sprites
// through their fakes), with an instance the operator created; on the
// local provider with the egress checks too (a site allowed, another
// refused, by the broker's proxy).
func TestConformanceServe(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"local", "modal", "fly-machines", "fly-sprites"} {
		t.Run(p, func(t *testing.T) {
			t.Parallel()
			conformanceSlots <- struct{}{}
			defer func() { <-conformanceSlots }()
			rs := startRedis(t)
			var env, args []string
			providers := ""
			switch p {
			case "local":
				site, siteEnv := egressSite(t)
				env = siteEnv
				port := strconv.Itoa(site.Port)
				args = []string{"--allowed-domain", "allowed.sg.test:" + port, "--denied-domain", "denied.sg.test:" + port}
			case "modal":
				_, env = startModal(t)
				providers = modalServe
			case "fly-machines":
				f := startFakeFly(t)
				env = []string{"FLY_API_TOKEN=" + f.token, "FLY_FLAPS_BASE_URL=" + f.url, "SSL_CERT_FILE=" + f.caFile}
				providers = fmt.Sprintf("providers:\n  - {name: local, kind: local}\n  - {name: fly-machines, kind: fly-machines, app: %q, org: sandgate-org}\ndefault_provider: fly-machines",
					"sandgate-conf-"+randHex(4))
			case "fly-sprites":
				token := "spr_e2e_" + randHex(16)
				apiURL, caFile, _ := startFakeSprites(t, token)
				env = []string{"SPRITE_TOKEN=" + token, "SPRITES_API_URL=" + apiURL, "SSL_CERT_FILE=" + caFile}
				providers = "providers:\n  - {name: local, kind: local}\n  - {name: fly-sprites, kind: fly-sprites}\ndefault_provider: fly-sprites"
			}
			cfg := newServeConfig(t, rs.Addr, serveOptions{Providers: providers})
			gw := startServeEnv(t, cfg, env...)
			var tok string
			if p == "local" {
				_, tok = anyEgressInstance(t, gw.Admin(t))
			} else {
				_, _, tok = obligationsInstance(t, gw, "conformance-"+p, 1, time.Hour)
			}
			wantConformance(t, p == "local", []string{"BROKER_URL=" + gw.URL, "BROKER_TOKEN=" + tok, "BROKER_CA=" + cfg.PKI.CAPath}, args...)
		})
	}
}

// TestConformanceFailsOnBrokenSetting: against an instance whose
// max_output_bytes is 4, `sandgate conformance` exits 1 naming the exec
// check (its output is cut), while the checks that need no output pass;
// against a broker that is not listening it exits 4.
func TestConformanceFailsOnBrokenSetting(t *testing.T) {
	t.Parallel()
	conformanceSlots <- struct{}{}
	defer func() { <-conformanceSlots }()
	_, cfg, gw := startOne(t)
	a := gw.Admin(t)
	acct := createAccount(t, a, "conformance-broken")
	req := adminapi.CreateInstanceRequest{AccountID: acct, Name: "tiny-output"}
	req.Scope.Limits = protocol.Limits{MaxOutputBytes: 4}
	var in adminapi.Instance
	if err := a.Do(context.Background(), http.MethodPost, "/instances", req, &in); err != nil {
		t.Fatal(err)
	}
	tok := issueToken(t, a, in.ID)
	env := []string{"BROKER_URL=" + gw.URL, "BROKER_TOKEN=" + tok, "BROKER_CA=" + cfg.PKI.CAPath}
	stdout, stderr, err := tryCLI(env, "conformance")
	if code := exitStatus(err); code != exitFailure {
		t.Errorf("sandgate conformance against max_output_bytes 4: exit %d (%v); want %d\n%s%s", code, err, exitFailure, stdout, stderr)
	}
	if !strings.Contains(stdout, "\nFAIL  exec: ") || !strings.Contains(stderr, "checks failed: exec") {
		t.Errorf("the exec check is not named as failed:\n%s%s", stdout, stderr)
	}
	for _, ok := range []string{"lease", "acquire", "files", "release"} {
		if !strings.Contains(stdout, "\nok    "+ok+" ") && !strings.HasPrefix(stdout, "ok    "+ok+" ") {
			t.Errorf("check %s did not pass:\n%s", ok, stdout)
		}
	}

	_, stderr, err = tryCLI(append(env, "BROKER_URL=https://127.0.0.1:1"), "conformance", "-q")
	if code := exitStatus(err); code != exitUnavailable || !strings.Contains(stderr, "unavailable") {
		t.Errorf("sandgate conformance against a closed port: exit %d, %s; want %d and the broker named unavailable", code, stderr, exitUnavailable)
	}
}

// exitStatus is a finished command's exit code: 0 for nil, -1 when it
// did not run to an exit.
func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}
