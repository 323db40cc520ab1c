// Command flyfake runs the fake Fly Machines API of package flytest as a
// process of its own, for end-to-end tests of `sandgate dev --provider
// fly-machines`. The token it accepts is read from FLYFAKE_TOKEN (never a
// flag: argv is visible to every process). Once it listens it writes
// -info, a JSON file {"url": …, "ca_file": …}; it destroys every Machine
// and exits on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sandgate/sandgate/providers/flymachines/flytest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flyfake:", err)
		os.Exit(1)
	}
}

func run() error {
	dataDir := flag.String("data-dir", "", "directory for the Machines and the CA file (required)")
	info := flag.String("info", "", "file to write {url, ca_file} to once listening (required)")
	orgs := flag.String("orgs", "", "comma-separated organisations apps may be created in; empty means any")
	execDeadline := flag.Duration("exec-deadline", 0, "answer 408 to an exec still running after this; 0 means none")
	flag.Parse()
	if *dataDir == "" || *info == "" {
		return fmt.Errorf("-data-dir and -info are required")
	}
	o := flytest.Options{Token: os.Getenv("FLYFAKE_TOKEN"), DataDir: *dataDir, ExecDeadline: *execDeadline}
	if *orgs != "" {
		o.Orgs = strings.Split(*orgs, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := flytest.New(ctx, o)
	if err != nil {
		return err
	}
	defer s.Close()
	b, _ := json.Marshal(map[string]string{"url": s.URL(), "ca_file": s.CAFile()})
	tmp := *info + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, *info); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
