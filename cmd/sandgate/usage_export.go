package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// usageExportCommand is `sandgate usage export`: the operator API's
// GET /admin/v1/usage written to a file or stdout, byte for byte.
func usageExportCommand() *cobra.Command {
	var (
		f           adminFlags
		sel         usageSelection
		out, format string
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Export the usage ledger as CSV or JSON lines (finance or admin token)",
		Long: `Export every usage ledger entry whose termination time is in [--from, --to)
(half-open, RFC 3339; default: the current calendar month, UTC), optionally
of one account, instance or agent, as CSV (RFC 4180, header row) or JSON lines.
The README's "For finance teams" section lists the columns and how to reconcile.

With --out the export is written to FILE.partial and renamed to FILE once
complete, so FILE never holds a cut-short export, and a line on stderr reports
the rows and bytes written. When stderr is a terminal a progress line counts
the rows meanwhile.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmtv, err := billing.ParseFormat(format)
			if err != nil {
				return usageErr(err)
			}
			month := billing.MonthOf(time.Now())
			q := url.Values{"format": {string(fmtv)}}
			for _, p := range []struct {
				name, v string
				def     time.Time
			}{{"from", sel.from, month}, {"to", sel.to, month.AddDate(0, 1, 0)}} {
				t := p.def
				if p.v != "" {
					if t, err = time.Parse(time.RFC3339, p.v); err != nil {
						return usageErr(fmt.Errorf("--%s takes an RFC 3339 time, e.g. 2026-10-01T00:00:00Z: %q", p.name, p.v))
					}
				}
				q.Set(p.name, t.UTC().Format(time.RFC3339Nano)) // a fraction of a second kept, as usage summary keeps it
			}
			for k, v := range map[string]string{"account": sel.acct, "instance": sel.inst, "agent": sel.agent, "size": sel.size} {
				if v != "" {
					q.Set(k, v)
				}
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			header := int64(0)
			if fmtv == billing.FormatCSV {
				header = 1
			}
			rep, err := exportUsage(cmd.Context(), c, "/usage?"+q.Encode(), out, header, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil || rep == nil {
				return err
			}
			// The report goes to stderr as text, so that it never mixes with
			// rows; as JSON (-o json) it is the command's answer, on stdout.
			if o, _ := outputOf(cmd); o.text() {
				_, err = fmt.Fprintf(cmd.ErrOrStderr(), "sandgate: wrote %d rows, %d bytes to %s\n", rep.Rows, rep.Bytes, rep.File)
				return err
			}
			return emit(cmd, rep, "")
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.url, "url", "", "operator API URL (default $SANDGATE_ADMIN_URL)")
	fl.StringVar(&f.token, "token", "", "finance or admin operator token (default $SANDGATE_ADMIN_TOKEN)")
	fl.DurationVar(&f.timeout, "timeout", 0, "bound on the whole export (0: none)")
	sel.addFlags(cmd, "only this account (default: every account, in id order)")
	fl.StringVar(&format, "format", "csv", "csv or jsonl")
	fl.StringVar(&out, "out", "", "write to this file (mode 0600) instead of stdout")
	return cmd
}

// exportReport is what an export to a file wrote.
type exportReport struct {
	File  string `json:"file"`
	Rows  int64  `json:"rows"` // rows past the header
	Bytes int64  `json:"bytes"`
}

// exportUsage streams path to out (a file, or stdout when "" or "-"),
// with a progress line on stderr when stderr is a terminal that the rows
// are not also going to. For a file it returns what it wrote.
func exportUsage(ctx context.Context, c *adminapi.Client, path, out string, header int64, stdout, stderr io.Writer) (*exportReport, error) {
	toStdout := out == "" || out == "-"
	p := newProgress(stderr, !(toStdout && isTerminal(stdout)))
	p.csv = header > 0
	defer p.stop()
	if toStdout {
		return nil, c.Stream(ctx, path, p.wrap(stdout))
	}
	tmp := out + ".partial"
	file, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := c.Stream(ctx, path, p.wrap(file)); err != nil {
		file.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("usage export cut short, %s not written: %w", filepath.Base(out), err)
	}
	if err := file.Close(); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return &exportReport{File: out, Rows: max(p.rows-header, 0), Bytes: p.n}, nil
}

// progress counts the lines of an export and, when its writer is a
// terminal, rewrites one status line on it every half second. Its
// goroutine exits on stop.
type progress struct {
	w   io.Writer
	csv bool // the rows are CSV: a quoted field may hold a line break

	mu     sync.Mutex
	rows   int64
	n      int64
	quoted bool // inside a quoted CSV field
	done   chan struct{}
	wg     sync.WaitGroup
}

func newProgress(stderr io.Writer, show bool) *progress {
	p := &progress{w: stderr, done: make(chan struct{})}
	if !show || !isTerminal(stderr) {
		return p
	}
	start := time.Now()
	p.wg.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		shown := false
		for {
			select {
			case <-t.C:
				p.show(start, false)
				shown = true
			case <-p.done:
				if shown {
					p.show(start, true)
				}
				return
			}
		}
	})
	return p
}

func (p *progress) show(start time.Time, last bool) {
	p.mu.Lock()
	rows, n := p.rows, p.n
	p.mu.Unlock()
	end := ""
	if last {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\rsandgate: %d lines, %.1f MB, %s%s", rows, float64(n)/1e6, time.Since(start).Truncate(time.Second), end)
}

func (p *progress) stop() {
	close(p.done)
	p.wg.Wait()
}

// wrap returns w counting what passes through it.
func (p *progress) wrap(w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		p.rows += p.count(b)
		p.n += int64(len(b))
		p.mu.Unlock()
		return w.Write(b)
	})
}

// count returns how many rows end in b, p.mu held: one per LF, but in CSV
// not a LF inside a quoted field (an adjustment's reason may hold line
// breaks). A doubled quote inside a field toggles twice.
func (p *progress) count(b []byte) int64 {
	if !p.csv {
		return int64(bytes.Count(b, []byte{'\n'}))
	}
	var n int64
	for _, c := range b {
		switch c {
		case '"':
			p.quoted = !p.quoted
		case '\n':
			if !p.quoted {
				n++
			}
		}
	}
	return n
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
