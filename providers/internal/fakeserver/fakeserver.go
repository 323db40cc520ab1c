// Package fakeserver starts the HTTPS listener of a fake vendor API
// (flytest, spritetest): TLS on loopback, with the certificate in a PEM
// file that a client trusts through SSL_CERT_FILE.
package fakeserver

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
)

// StartTLS serves h over TLS on loopback and writes the server's
// certificate to dir/ca.pem, whose path it returns. On error nothing is
// left running.
func StartTLS(h http.Handler, dir string) (*httptest.Server, string, error) {
	srv := httptest.NewUnstartedServer(h)
	srv.StartTLS()
	caFile := filepath.Join(dir, "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o644); err != nil {
		srv.Close()
		return nil, "", err
	}
	return srv, caFile, nil
}
