package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// issue makes a P-256 key and a certificate of tmpl for it, signed with
// signer as parent; with a nil parent the certificate signs itself.
func issue(tmpl, parent *x509.Certificate, signer *ecdsa.PrivateKey) (der []byte, key *ecdsa.PrivateKey, err error) {
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if parent == nil {
		parent, signer = tmpl, key
	}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	return der, key, err
}

// DevCerts returns the dev broker's server certificate, creating a
// self-signed CA and a certificate for localhost, 127.0.0.1 and ::1 in dir
// the first time. The CA's path goes into dev.env as BROKER_CA.
func DevCerts(dir string, now time.Time) (cert tls.Certificate, caPath string, err error) {
	caPath = filepath.Join(dir, "ca.pem")
	certPath := filepath.Join(dir, "server.pem")
	keyPath := filepath.Join(dir, "server-key.pem")
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil && now.Add(24*time.Hour).Before(leaf.NotAfter) {
			if _, err := os.Stat(caPath); err == nil {
				return c, caPath, nil
			}
		}
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sandgate dev CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, caKey, err := issue(caTmpl, nil, nil)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	ca, _ := x509.ParseCertificate(caDER)
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(364 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, key, err := issue(tmpl, ca, caKey)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	err = errors.Join(
		writePEM(caPath, "CERTIFICATE", caDER, 0o644),
		writePEM(certPath, "CERTIFICATE", der, 0o644),
		writePEM(keyPath, "EC PRIVATE KEY", keyDER, 0o600),
	)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("dev certificates: %w", err)
	}
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	return c, caPath, err
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// CertFiles is the public listener's certificate and key, read from
// their files at start and again on Reload (SIGHUP), so that a renewed
// certificate needs no restart. Connections already open keep the
// certificate of their handshake; new ones get the newest loaded. It is
// safe for concurrent use.
type CertFiles struct {
	cur atomic.Pointer[tls.Certificate]
}

// LoadCertFiles reads the certificate and key pair of certFile and keyFile.
func LoadCertFiles(certFile, keyFile string) (*CertFiles, error) {
	c := &CertFiles{}
	if err := c.Reload(certFile, keyFile); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the pair of certFile and keyFile and serves it to new
// connections from then on. A pair that does not load (missing, not
// PEM, key and certificate not matching) is an error, and the pair
// served before stays.
func (c *CertFiles) Reload(certFile, keyFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("tls.cert_file and tls.key_file: %w", err)
	}
	c.cur.Store(&cert)
	return nil
}

// Apply makes cfg serve the pair loaded last, in place of its own.
func (c *CertFiles) Apply(cfg *tls.Config) {
	cfg.Certificates = nil
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }
}
