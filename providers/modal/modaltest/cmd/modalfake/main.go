// Command modalfake runs the fake Modal server of package modaltest on
// loopback until it is interrupted, and prints the environment that points
// a broker at it:
//
//	go run ./providers/modal/modaltest/cmd/modalfake --data-dir /tmp/modalfake >modal.env
//	set -a; . ./modal.env; set +a; go run ./cmd/sandgate dev --provider modal
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sandgate/sandgate/providers/modal/modaltest"
)

func main() {
	dataDir := flag.String("data-dir", "", "where the fake keeps its sandboxes, snapshots and CA (required)")
	tokenID := flag.String("token-id", "ak-modalfake", "the token id the fake accepts")
	flag.Parse()
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "modalfake: --data-dir is required")
		os.Exit(2)
	}
	var b [16]byte
	rand.Read(b[:])
	secret := "as-" + hex.EncodeToString(b[:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	s, err := modaltest.Start(ctx, modaltest.Config{TokenID: *tokenID, TokenSecret: secret, DataDir: *dataDir, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "modalfake:", err)
		os.Exit(1)
	}
	fmt.Printf("MODAL_SERVER_URL=%s\nMODAL_TOKEN_ID=%s\nMODAL_TOKEN_SECRET=%s\nSSL_CERT_FILE=%s\n", s.URL, *tokenID, secret, s.CAFile)
	<-ctx.Done()
	s.Close()
}
