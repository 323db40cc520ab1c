package main

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSIGHUPReloadsCertificateAndOperatorTokens: serve, sent SIGHUP after
// its certificate files were replaced and an operator token added and
// another removed, serves the new certificate to new connections while a
// keep-alive connection opened before goes on working, accepts the added
// token and refuses the removed one. A broken pair then keeps the
// certificate in force, and the failure is logged and counted.
func TestSIGHUPReloadsCertificateAndOperatorTokens(t *testing.T) {
	_, cfg, s := startOne(t)
	next := newPKI(t, t.TempDir())
	roots := cfg.PKI.Roots.Clone()
	roots.AppendCertsFromPEM(mustRead(t, next.CAPath))

	// One connection, kept alive across the reload.
	held := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 1}}
	first, _ := leafOf(t, held, s.URL)
	// A fresh connection each time.
	fresh := func() *http.Client {
		return &http.Client{Timeout: time.Minute, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}}
	}
	want, err := tls.LoadX509KeyPair(next.CertPath, next.KeyPath)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate files renewed in place, and the operators changed: a
	// new admin by hash, the operator-role token gone.
	for _, f := range [][2]string{{next.CertPath, cfg.PKI.CertPath}, {next.KeyPath, cfg.PKI.KeyPath}} {
		if err := os.WriteFile(f[1], mustRead(t, f[0]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newTok := "sgo_" + randHex(24)
	sum := sha256.Sum256([]byte(newTok))
	yaml := string(mustRead(t, cfg.Path))
	opHash := sha256.Sum256([]byte(cfg.OpToken))
	before := fmt.Sprintf("  - name: e2e-operator\n    role: operator\n    token_sha256: %q\n", hex.EncodeToString(opHash[:]))
	after := fmt.Sprintf("  - name: e2e-added\n    role: admin\n    token_sha256: %q\n", hex.EncodeToString(sum[:]))
	if !strings.Contains(yaml, before) {
		t.Fatalf("the config has no operator entry %q", before)
	}
	if err := os.WriteFile(cfg.Path, []byte(strings.Replace(yaml, before, after, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	whoami := func(tok string) int {
		code, _ := rawCall(t, &http.Client{Timeout: time.Minute}, http.MethodGet, s.AdminURL+"/admin/v1/whoami", tok, nil)
		return code
	}
	if got := whoami(newTok); got != http.StatusUnauthorized {
		t.Fatalf("the added token before SIGHUP: %d; want 401", got)
	}

	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new connection to see the new certificate", func() (bool, error) {
		got, _ := leafOf(t, fresh(), s.URL)
		return got.Equal(mustLeaf(t, want)), errors.New("still the old certificate")
	})
	waitFor(t, "the added operator token to work", func() (bool, error) {
		return whoami(newTok) == http.StatusOK, errors.New("refused")
	})
	if got := whoami(cfg.OpToken); got != http.StatusUnauthorized {
		t.Errorf("the removed operator token after SIGHUP: %d; want 401", got)
	}
	if got := whoami(cfg.AdminToken); got != http.StatusOK {
		t.Errorf("the kept admin token (token_env) after SIGHUP: %d; want 200", got)
	}
	// The held connection is the same one, and still has its handshake's
	// certificate.
	got, reused := leafOf(t, held, s.URL)
	if !reused || !got.Equal(first) {
		t.Errorf("the keep-alive connection after SIGHUP: reused %v, same certificate %v; want both", reused, got.Equal(first))
	}

	// A broken pair: the certificate in force stays, the failure is
	// logged and counted, and the broker serves on.
	if err := os.WriteFile(cfg.PKI.CertPath, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the failed reload to be counted", func() (bool, error) {
		resp, err := http.Get(s.AdminURL + "/metrics")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `sandgate_config_reloads_total{result="failed"} 1`), err
	})
	if !strings.Contains(s.Logs(), "configuration reload failed") {
		t.Error("the failed reload was not logged")
	}
	if got, _ := leafOf(t, fresh(), s.URL); !got.Equal(mustLeaf(t, want)) {
		t.Error("after a broken pair, new connections no longer get the last good certificate")
	}
	if got := whoami(newTok); got != http.StatusOK {
		t.Errorf("after a failed reload the added token answers %d; want 200", got)
	}
}

// leafOf sends GET /v1/lease with hc and returns the server's
// certificate and whether the connection was one used before.
func leafOf(t testing.TB, hc *http.Client, url string) (*x509.Certificate, bool) {
	t.Helper()
	var reused bool
	req, err := http.NewRequest(http.MethodGet, url+"/v1/lease", nil)
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/lease: %v", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/lease without a token: %d; want 401", resp.StatusCode)
	}
	return resp.TLS.PeerCertificates[0], reused
}

func mustLeaf(t testing.TB, c tls.Certificate) *x509.Certificate {
	t.Helper()
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
