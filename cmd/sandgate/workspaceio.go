package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
)

// workspaceExecCommand is `sandgate workspace exec ID -- ARGV…`: POST
// /admin/v1/workspaces/{id}/exec, the command's output on the matching
// streams and its exit code as sandgate's.
func workspaceExecCommand(f *adminFlags) *cobra.Command {
	var timeout time.Duration
	var stdin, dir string
	cmd := &cobra.Command{
		Use:   "exec ID [--timeout D] [--stdin FILE|-] -- ARGV...",
		Short: "Run a command in a tenant's workspace (admin token; audited, never the argv)",
		Long: "exec runs ARGV in the workspace as the tenant's own exec would, under its instance's scope\n" +
			"(timeouts, output caps), prints its stdout and stderr to sandgate's, and exits with its exit\n" +
			"code. When the command did not run, sandgate's own exit codes apply (see sandgate --help).\n" +
			"The audit log records the operator, the workspace and the action, never the argv.",
		Example: `  sandgate workspace exec ws_… -- ls -la /workspace
  sandgate workspace exec ws_… --stdin script.sh -- sh -s
  sandgate workspace exec ws_… -o json -- cat /etc/os-release | jq -r .stdout_b64 | base64 -d`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completeWorkspaceID,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return usageErr(errors.New("put the command after --, as in: sandgate workspace exec ID -- ARGV"))
			}
			req := adminapi.ExecRequest{Argv: args[1:], Dir: dir, TimeoutSeconds: int64(timeout / time.Second)}
			if stdin != "" {
				b, err := readInput(cmd, stdin)
				if err != nil {
					return err
				}
				req.StdinB64 = base64.StdEncoding.EncodeToString(b)
			}
			// The request lasts as long as the command, and then some.
			if bound := timeout + time.Minute; f.timeout < bound {
				f.timeout = bound
			}
			var res adminapi.ExecResponse
			if err := f.do(cmd, http.MethodPost, workspacePath(args[0], "exec"), req, &res); err != nil {
				return err
			}
			o, err := outputOf(cmd)
			if err != nil {
				return err
			}
			if o.json && !o.quiet {
				if err := emit(cmd, res, ""); err != nil {
					return err
				}
			} else if err := writeExecOutput(cmd, res, !o.quiet); err != nil {
				return err
			}
			if res.ExitCode != 0 {
				return &exitError{code: res.ExitCode, err: fmt.Errorf("the command exited %d", res.ExitCode), silent: true}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&timeout, "timeout", 0, "the command's timeout (default: the instance's default_exec_timeout; at most its max_exec_timeout)")
	fl.StringVar(&stdin, "stdin", "", "file whose contents are the command's stdin, or - for sandgate's stdin")
	fl.StringVar(&dir, "dir", "", "absolute working directory (default: the image's)")
	return cmd
}

// writeExecOutput writes a command's output to the matching streams and,
// with notes, what was cut (a truncated stream, a timeout) to stderr.
func writeExecOutput(cmd *cobra.Command, res adminapi.ExecResponse, notes bool) error {
	for _, s := range []struct {
		b64       string
		w         io.Writer
		name      string
		truncated bool
		total     int64
	}{{res.StdoutB64, cmd.OutOrStdout(), "stdout", res.StdoutTruncated, res.StdoutBytes},
		{res.StderrB64, cmd.ErrOrStderr(), "stderr", res.StderrTruncated, res.StderrBytes}} {
		b, err := base64.StdEncoding.DecodeString(s.b64)
		if err != nil {
			return fmt.Errorf("operator API: %s_b64: %w", s.name, err)
		}
		if _, err := s.w.Write(b); err != nil {
			return err
		}
		if notes && s.truncated {
			fmt.Fprintf(cmd.ErrOrStderr(), "sandgate: %s cut at %d of %d bytes (the instance's max_output_bytes)\n", s.name, len(b), s.total)
		}
	}
	if notes && res.TimedOut {
		fmt.Fprintln(cmd.ErrOrStderr(), "sandgate: the command was killed at its timeout")
	}
	return nil
}

// workspaceFilesCommand is `sandgate workspace files get|put`.
func workspaceFilesCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "files",
		Short: "Read and write a file of a tenant's workspace (admin token; audited, never the path or contents)",
		Example: `  sandgate workspace files get ws_… /workspace/out.log
  sandgate workspace files put ws_… /workspace/fix.py fix.py`,
	}
	var out string
	get := &cobra.Command{
		Use:   "get ID PATH [--out FILE]",
		Short: "Print a file of the workspace (at most its instance's max_file_bytes), or write it to --out",
		Example: `  sandgate workspace files get ws_… /workspace/out.log
  sandgate workspace files get ws_… /workspace/db.sqlite --out db.sqlite`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeWorkspaceID,
		RunE: func(cmd *cobra.Command, args []string) error {
			var res adminapi.ReadFileResponse
			err := f.do(cmd, http.MethodPost, workspacePath(args[0], "files/read"), adminapi.ReadFileRequest{Path: args[1]}, &res)
			if err != nil {
				return err
			}
			b, err := base64.StdEncoding.DecodeString(res.ContentsB64)
			if err != nil {
				return fmt.Errorf("operator API: contents_b64: %w", err)
			}
			o, err := outputOf(cmd)
			if err != nil {
				return err
			}
			switch {
			case out != "" && out != "-":
				if err := os.WriteFile(out, b, 0o600); err != nil {
					return err
				}
				return emit(cmd, res, fmt.Sprintf("wrote %d bytes to %s", len(b), out))
			case o.json && !o.quiet:
				return emit(cmd, res, "")
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	get.Flags().StringVar(&out, "out", "", "write to this file (mode 0600) instead of stdout")
	put := &cobra.Command{
		Use:   "put ID PATH [FILE|-]",
		Short: "Write a file of the workspace from FILE or stdin (at most its instance's max_file_bytes, and about 750 KiB)",
		Example: `  sandgate workspace files put ws_… /workspace/fix.py fix.py
  echo 'debug=1' | sandgate workspace files put ws_… /workspace/.env`,
		Args:              cobra.RangeArgs(2, 3),
		ValidArgsFunction: completeWorkspaceID,
		RunE: func(cmd *cobra.Command, args []string) error {
			src := "-"
			if len(args) == 3 {
				src = args[2]
			}
			b, err := readInput(cmd, src)
			if err != nil {
				return err
			}
			req := adminapi.WriteFileRequest{Path: args[1], ContentsB64: base64.StdEncoding.EncodeToString(b)}
			if err := f.do(cmd, http.MethodPost, workspacePath(args[0], "files/write"), req, nil); err != nil {
				return err
			}
			return emit(cmd, struct {
				Path  string `json:"path"`
				Bytes int    `json:"bytes"`
			}{args[1], len(b)}, fmt.Sprintf("wrote %d bytes", len(b)))
		},
	}
	cmd.AddCommand(get, put)
	return cmd
}

// workspacePath is the operator API's path of workspace id's rest.
func workspacePath(id, rest string) string { return "/workspaces/" + url.PathEscape(id) + "/" + rest }

// readInput reads the file name, or sandgate's stdin for "-".
func readInput(cmd *cobra.Command, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(cmd.InOrStdin())
	}
	return os.ReadFile(name)
}
