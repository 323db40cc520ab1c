//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/broker"
)

// readyz reads the operator listener's /readyz.
func readyz(adminURL string) (int, broker.Readiness, error) {
	resp, err := http.Get(adminURL + "/readyz")
	if err != nil {
		return 0, broker.Readiness{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r broker.Readiness
	if err := json.Unmarshal(b, &r); err != nil {
		return resp.StatusCode, r, fmt.Errorf("readyz body %q: %w", b, err)
	}
	return resp.StatusCode, r, nil
}

// TestE2EReadyzFollowsRedis: /readyz is 200 with Redis up, 503 naming
// redis while it is down, and 200 again soon after it comes back, with
// no restart; /livez stays 200 throughout; the public listener's /readyz
// follows without details.
func TestE2EReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	rs, cfg, s := startOne(t)
	hc := httpsClient(cfg.PKI.Roots)
	wantReady := func(what string, ready bool, failing string) {
		t.Helper()
		waitFor(t, what, func() (bool, error) {
			code, r, err := readyz(s.AdminURL)
			if err != nil {
				return false, err
			}
			ok := r.Ready == ready && (code == http.StatusOK) == ready && (failing == "" || slices.Contains(r.Failing, failing))
			return ok, fmt.Errorf("readyz = %d %+v", code, r)
		})
		resp, err := hc.Get(s.URL + "/readyz")
		if err != nil {
			t.Fatalf("public /readyz: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if (resp.StatusCode == http.StatusOK) != ready {
			t.Errorf("public /readyz = %d %q while the operator's says ready=%v", resp.StatusCode, b, ready)
		}
		if resp, err := http.Get(s.AdminURL + "/livez"); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("/livez = %v, %v; want 200", resp, err)
		} else {
			resp.Body.Close()
		}
	}
	wantReady("ready with Redis up", true, "")
	rs.Kill()
	wantReady("not ready with Redis down", false, "redis")
	rs.Restart()
	back := time.Now()
	wantReady("ready again once Redis is back", true, "")
	if d := time.Since(back); d > 10*time.Second {
		t.Errorf("ready again %v after Redis came back; want within a few seconds", d)
	}
	// Through the outage, go-redis's own messages too were structured
	// lines of the one JSON log, with durations in milliseconds.
	for _, line := range strings.Split(strings.TrimSpace(s.stderr.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("a log line is not JSON: %q", line)
			continue
		}
		if _, ok := m["duration"]; ok {
			t.Errorf("a log line has a duration without its unit: %q", line)
		}
	}
}

// TestE2EReadyzFalseBeforeListenerCloses: on SIGTERM, with a drain delay,
// /readyz turns false (naming draining) while the public listener still
// answers, so a load balancer moves traffic away before connections are
// refused; then the process exits cleanly.
func TestE2EReadyzFalseBeforeListenerCloses(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	s := startServeEnv(t, cfg, "SANDGATE_DRAIN_DELAY=3s")
	waitFor(t, "ready", func() (bool, error) {
		code, r, err := readyz(s.AdminURL)
		return err == nil && r.Ready, fmt.Errorf("readyz = %d %+v, %v", code, r, err)
	})
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "not ready while draining", func() (bool, error) {
		code, r, err := readyz(s.AdminURL)
		return err == nil && code == http.StatusServiceUnavailable && slices.Contains(r.Failing, "draining"),
			fmt.Errorf("readyz = %d %+v, %v", code, r, err)
	})
	// The public listener still serves: a v1 request gets the gateway's answer.
	resp, err := httpsClient(cfg.PKI.Roots).Get(s.URL + "/v1/lease")
	if err != nil {
		t.Fatalf("public listener refused a request while only not ready: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/lease while not ready = %d; want 401 (still serving)", resp.StatusCode)
	}
	<-s.done
}

// TestE2EServeStartsWithoutRedis: `serve` starts with Redis down, is not
// ready, and recovers on its own once Redis answers: ready, and an
// acquire succeeds, with no restart.
func TestE2EServeStartsWithoutRedis(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	rs.Kill()
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	s := startServe(t, cfg)
	code, r, err := readyz(s.AdminURL)
	if err != nil || code != http.StatusServiceUnavailable || !slices.Contains(r.Failing, "redis") {
		t.Fatalf("readyz with Redis down = %d %+v, %v; want 503 naming redis", code, r, err)
	}
	rs.Restart()
	waitFor(t, "ready once Redis answers", func() (bool, error) {
		code, r, err := readyz(s.AdminURL)
		return err == nil && r.Ready, fmt.Errorf("readyz = %d %+v, %v", code, r, err)
	})
	adm, inst := newAccountInstance(t, s, "e2e-late-redis", 1)
	c := s.Client(t, issueToken(t, adm, inst))
	ws := acquire(t, c, "late-redis-1")
	if _, err := c.Release(t.Context(), ws.WorkspaceID); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestVersion: `sandgate version` and `--version` print the version, the
// commit and the Go version.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out := runCLI(t, nil, args...)
		if !strings.HasPrefix(out, "sandgate ") || !strings.Contains(out, "\ncommit ") || !strings.Contains(out, "\ngo1.") {
			t.Errorf("sandgate %v printed %q; want version, commit and Go version lines", args, out)
		}
	}
}
