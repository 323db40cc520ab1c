package broker

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCertFilesReload: a renewed pair is served to the next handshake; a
// pair that does not load is refused and the one served before stays.
func TestCertFilesReload(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	now := time.Now()
	a, _, err := DevCerts(first, now)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := DevCerts(second, now)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(first, "server.pem"), filepath.Join(first, "server-key.pem")
	c, err := LoadCertFiles(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ServerTLS(tls.Certificate{})
	c.Apply(cfg)
	served := func() []byte {
		t.Helper()
		got, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return got.Certificate[0]
	}
	if len(cfg.Certificates) != 0 || string(served()) != string(a.Certificate[0]) {
		t.Fatal("Apply: the config does not serve the loaded pair alone")
	}
	if err := c.Reload(filepath.Join(second, "server.pem"), filepath.Join(second, "server-key.pem")); err != nil {
		t.Fatal(err)
	}
	if string(served()) != string(b.Certificate[0]) {
		t.Error("after Reload, the handshake does not get the new certificate")
	}
	// The first pair's certificate with the second's key: no match.
	if err := os.WriteFile(keyPath, mustReadFile(t, filepath.Join(second, "server-key.pem")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(certPath, keyPath); err == nil {
		t.Error("Reload of a mismatched pair succeeded")
	}
	if err := c.Reload(filepath.Join(first, "missing.pem"), keyPath); err == nil {
		t.Error("Reload of a missing file succeeded")
	}
	if string(served()) != string(b.Certificate[0]) {
		t.Error("after failed reloads, the handshake no longer gets the last good certificate")
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
