//go:build linux

// Command sandgate-guest is the broker's agent inside a vendor guest (a Fly
// Machine or a sprite): it runs every tenant process in a jail of its own
// namespaces and keeps the guest's deadline from outside every jail. See
// docs/guest.md.
//
//	sandgate-guest keeper --until UNIX [--detach] [--agent-dir DIR] [--egress-sock PATH --egress-proxy HOST:PORT
//	    --egress-server-name NAME --egress-user WSID --egress-cred-file F [--egress-ca F]]
//	sandgate-guest run [--dir DIR] [--env K=V]... [--egress-sock PATH] [--proxy-port N]
//	    [--timeout SECONDS] [--stdout-file F --stderr-file F --status-file F --detach] -- ARGV...
//	sandgate-guest keeper-status
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sandgate/sandgate/providers/guest"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:]))
}

// usageExit is the exit status of a command line it cannot parse.
const usageExit = 2

func run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: sandgate-guest keeper|run|keeper-status ...")
		return usageExit
	}
	switch args[0] {
	case guest.InitCommand:
		return guest.JailInit()
	case "keeper":
		return keeper(ctx, args[1:])
	case "run":
		return runJail(ctx, args[1:])
	case "keeper-status":
		if len(args) != 1 {
			fmt.Fprintln(os.Stderr, "sandgate-guest keeper-status: no arguments")
			return usageExit
		}
		return guest.KeeperStatus("")
	}
	fmt.Fprintf(os.Stderr, "sandgate-guest: unknown command %q\n", args[0])
	return usageExit
}

func keeper(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("keeper", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	until := fs.Int64("until", 0, "")
	detach := fs.Bool("detach", false, "")
	readyFD := fs.Int("ready-fd", 0, "")
	agentDir := fs.String("agent-dir", guest.DefaultAgentDir, "")
	var fw guest.ForwardConfig
	fs.StringVar(&fw.Sock, "egress-sock", "", "")
	fs.StringVar(&fw.Proxy, "egress-proxy", "", "")
	fs.StringVar(&fw.ServerName, "egress-server-name", "", "")
	fs.StringVar(&fw.User, "egress-user", "", "")
	fs.StringVar(&fw.CredFile, "egress-cred-file", "", "")
	fs.StringVar(&fw.CAFile, "egress-ca", "", "")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 || *until <= 0 {
		fmt.Fprintln(os.Stderr, "sandgate-guest keeper: bad arguments")
		return usageExit
	}
	if *detach {
		return guest.Detach(append([]string{"keeper"}, withoutDetach(args)...), true)
	}
	c := guest.KeeperConfig{Until: time.Unix(*until, 0), AgentDir: *agentDir, ReadyFD: *readyFD}
	if fw.Sock != "" {
		if fw.Proxy == "" || fw.User == "" || fw.CredFile == "" {
			fmt.Fprintln(os.Stderr, "sandgate-guest keeper: --egress-sock needs --egress-proxy, --egress-user and --egress-cred-file")
			return usageExit
		}
		c.Forward = &fw
	}
	return guest.Keep(ctx, c)
}

// envFlag collects repeated --env K=V pairs.
type envFlag []string

func (e *envFlag) String() string { return "" }
func (e *envFlag) Set(v string) error {
	*e = append(*e, v)
	return nil
}

func runJail(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var c guest.RunConfig
	var env envFlag
	fs.StringVar(&c.Dir, "dir", "", "")
	fs.Var(&env, "env", "")
	fs.StringVar(&c.EgressSock, "egress-sock", "", "")
	fs.IntVar(&c.ProxyPort, "proxy-port", guest.DefaultProxyPort, "")
	timeout := fs.Int64("timeout", 0, "")
	fs.StringVar(&c.StdoutFile, "stdout-file", "", "")
	fs.StringVar(&c.StderrFile, "stderr-file", "", "")
	fs.StringVar(&c.StatusFile, "status-file", "", "")
	detach := fs.Bool("detach", false, "")
	fs.StringVar(&c.AgentDir, "agent-dir", guest.DefaultAgentDir, "")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 || *timeout < 0 || c.ProxyPort <= 0 || c.ProxyPort > 65535 {
		fmt.Fprintln(os.Stderr, "sandgate-guest run: bad arguments")
		return usageExit
	}
	c.Argv = fs.Args()
	c.Env = env
	c.Timeout = time.Duration(*timeout) * time.Second
	if *detach {
		return guest.Detach(append([]string{"run"}, withoutDetach(args)...), false)
	}
	return guest.Run(ctx, c)
}

// withoutDetach returns args without the --detach flag (before "--"), for
// the detached child.
func withoutDetach(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if a == "--detach" || a == "-detach" || a == "--detach=true" || a == "-detach=true" {
			continue
		}
		out = append(out, a)
	}
	return out
}
