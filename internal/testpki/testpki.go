// Package testpki issues throwaway certificates for tests and fake
// servers: a CA of its own and one server certificate it signed.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

// Issued is a CA and the server certificate it signed.
type Issued struct {
	CA      *x509.Certificate
	CADER   []byte            // the CA's certificate, DER
	LeafDER []byte            // the server's certificate, DER
	Key     *ecdsa.PrivateKey // the server's key
}

// Issue makes a CA named caName and a server certificate for dns (its
// common name the first of them) and ips, signed by it, both valid for a
// day. It fails the test if that fails.
func Issue(t testing.TB, caName string, dns []string, ips []net.IP) Issued {
	t.Helper()
	pki, err := New(caName, dns, ips, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki
}

// New is Issue for a fake server's constructor, which has no testing.TB
// and may outlive a test (modaltest's modalfake runs until interrupted):
// both certificates are valid for validFor.
func New(caName string, dns []string, ips []net.IP, validFor time.Duration) (Issued, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validFor), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Issued{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Issued{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	var cn string
	if len(dns) > 0 {
		cn = dns[0]
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn}, DNSNames: dns, IPAddresses: ips,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validFor),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return Issued{}, err
	}
	return Issued{CA: ca, CADER: caDER, LeafDER: leafDER, Key: key}, nil
}
