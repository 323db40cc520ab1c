package main

import (
	"errors"
	"net"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
)

// Exit codes of every command, documented in the root command's help and
// the README's CLI section.
const (
	exitFailure     = 1 // any other failure
	exitUsage       = 2 // a bad flag, argument or subcommand
	exitRefused     = 3 // the broker refused the request (4xx)
	exitUnavailable = 4 // the broker failed (5xx) or could not be reached
	exitDrift       = 5 // usage reconcile found drift
)

// exitHelp is the root command's help text on exit codes.
const exitHelp = `Exit codes:
  0  success
  1  any other failure
  2  usage error: a bad flag, argument or subcommand
  3  refused by the broker (a 4xx answer: bad request, not found, forbidden)
  4  broker unavailable: a 5xx answer, or the broker could not be reached
  5  drift found by 'usage reconcile'
'workspace exec' exits with the command's own exit code once the command
ran (0-255; -o json carries it as exit_code too); the codes above apply
only when it did not run, with a 'sandgate:' line on stderr.`

// exitError is an error with the exit code it ends the process with.
type exitError struct {
	code int
	err  error
	// silent: main prints nothing, the code says it all (the exit code
	// of a command run by workspace exec).
	silent bool
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr marks err as a usage error (exit 2).
func usageErr(err error) error { return &exitError{code: exitUsage, err: err} }

// exitCode is the process's exit code for err, which a command returned:
// the code of an exitError in its chain; 3 or 4 by an operator API
// answer's status; 4 when the broker could not be reached; else 1.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ae *adminapi.APIError
	if errors.As(err, &ae) {
		if ae.Status >= 500 {
			return exitUnavailable
		}
		return exitRefused
	}
	// Not net.Error: a syscall.Errno such as ENOENT is one too.
	var oe *net.OpError
	var de *net.DNSError
	if errors.As(err, &oe) || errors.As(err, &de) || errors.Is(err, syscall.ECONNREFUSED) {
		return exitUnavailable
	}
	// cobra's own refusal of an unknown subcommand of the root.
	if strings.HasPrefix(err.Error(), "unknown command ") {
		return exitUsage
	}
	return exitFailure
}

// markUsageErrors makes the flag and argument errors of root and every
// command under it usage errors (exit 2).
func markUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					return usageErr(err)
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
