// Command fakesprites runs the fake Fly Sprites API of package spritetest
// as its own process, for end-to-end tests of `sandgate dev --provider
// fly-sprites`. It accepts the token in SPRITE_TOKEN, keeps its sprites
// under --data-dir, writes SPRITES_API_URL and SSL_CERT_FILE lines to
// --info once it serves, and deletes every sprite on SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sandgate/sandgate/providers/flysprites/spritetest"
)

func main() {
	dataDir := flag.String("data-dir", "", "where the sprites live (required)")
	info := flag.String("info", "", "file to write SPRITES_API_URL and SSL_CERT_FILE to (required)")
	flag.Parse()
	if *dataDir == "" || *info == "" {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv, err := spritetest.New(ctx, spritetest.Config{Token: os.Getenv("SPRITE_TOKEN"), DataDir: *dataDir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakesprites:", err)
		os.Exit(1)
	}
	body := fmt.Sprintf("SPRITES_API_URL=%s\nSSL_CERT_FILE=%s\n", srv.URL, srv.CAFile)
	err = os.WriteFile(*info+".tmp", []byte(body), 0o600)
	if err == nil {
		err = os.Rename(*info+".tmp", *info)
	}
	if err != nil {
		srv.Close()
		fmt.Fprintln(os.Stderr, "fakesprites:", err)
		os.Exit(1)
	}
	<-ctx.Done()
	srv.Close()
}
