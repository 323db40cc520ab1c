package flysprites

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
)

// Stream ids of the non-TTY frame layout (sheet §5.2): every binary
// message is [1 byte stream id][payload].
const (
	streamStdin    byte = 0
	streamStdout   byte = 1
	streamStderr   byte = 2
	streamExit     byte = 3
	streamStdinEOF byte = 4
)

// Keepalive and sizes of sprites-go (sheet §5.1).
const (
	pingEvery    = 15 * time.Second
	readLimit    = 1<<20 + 64       // 1 MiB buffers, and the stream id
	stdinChunk   = 16 << 10         // with its stream id, well under any peer's frame limit (coder/websocket: 32 KiB)
	killGrace    = 5 * time.Second  // after the timeout: the wrapper should have ended it by then
	exitWait     = 10 * time.Second // after a kill: how long the exit is awaited
	cleanupLimit = 10 * time.Second // the kill of a canceled command, outliving its request
	termWait     = 2 * time.Second  // after a TERM: how long the exit is awaited before KILL
)

// wsCommand is one command over the exec WebSocket.
type wsCommand struct {
	argv  []string
	env   []string // KEY=VALUE; nil: no env parameter at all (the sprite's default environment)
	dir   string
	stdin []byte
	// max is what is kept of each stream; the rest is counted.
	max int64
	// killAfter, when > 0: the session is killed this long after the
	// start, and the result is a timeout.
	killAfter time.Duration
}

// wsResult is what came back.
type wsResult struct {
	res    providers.ExecResult
	killed bool // killAfter fired
}

// execURL is the WebSocket URL: the base URL's scheme swapped (https→wss,
// http→ws) as sprites-go does (sheet §1), the argv as repeated cmd
// parameters, path = argv[0], env as repeated KEY=VALUE (sheet §5.1).
func (c *client) execURL(name string, cmd wsCommand) string {
	u := *c.base
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + spritePath(name, "/exec")
	u.RawPath = ""
	q := url.Values{}
	for _, a := range cmd.argv {
		q.Add("cmd", a)
	}
	q.Set("path", cmd.argv[0])
	for _, kv := range cmd.env {
		q.Add("env", kv)
	}
	if cmd.dir != "" {
		q.Set("dir", cmd.dir)
	}
	q.Set("stdin", strconv.FormatBool(len(cmd.stdin) > 0))
	u.RawQuery = q.Encode()
	return u.String()
}

// textMessage is a JSON text frame (sheet §5.2). session_id is a string to
// sprites-go and a number in the docs (UNCERTAIN): both are accepted.
type textMessage struct {
	Type      string          `json:"type"`
	SessionID json.RawMessage `json:"session_id"`
	ExitCode  *int            `json:"exit_code"`
}

func sessionID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// isExit reports whether m ends the command: binary frame 3 or the text
// exit message.
// sessionInfo returns the session id a session_info message carries.
func sessionInfo(m wsMessage) (string, bool) {
	if m.typ != websocket.MessageText {
		return "", false
	}
	var tm textMessage
	if json.Unmarshal(m.data, &tm) != nil || tm.Type != "session_info" {
		return "", false
	}
	return sessionID(tm.SessionID), true
}

func isExit(m wsMessage) bool {
	if m.typ == websocket.MessageBinary {
		return len(m.data) > 0 && m.data[0] == streamExit
	}
	var tm textMessage
	return json.Unmarshal(m.data, &tm) == nil && tm.Type == "exit"
}

type wsMessage struct {
	typ  websocket.MessageType
	data []byte
	err  error
}

// errNoExit is a socket that closed without an exit message: the result
// is unknown, never a success (sheet §5.2).
var errNoExit = errors.New("sprites: exec: the connection closed without an exit status")

// dial opens the exec WebSocket. Nothing runs before the upgrade, so a 429
// there is retried like a REST call's (sheet §2).
func (c *client) dial(ctx context.Context, name string, cmd wsCommand) (*websocket.Conn, error) {
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+c.token.Reveal())
	for attempt := 0; ; attempt++ {
		dctx, dcancel := context.WithTimeout(ctx, c.timeout)
		conn, resp, err := websocket.Dial(dctx, c.execURL(name, cmd), &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: hdr})
		dcancel()
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sprites: exec: %w", context.Cause(ctx))
		}
		if resp == nil || resp.StatusCode < 400 {
			// The library's error may quote the URL, which holds the argv.
			return nil, errors.New("sprites: exec: the WebSocket did not open")
		}
		ae := readError("exec", resp)
		wait := cmp.Or(ae.RetryAfter, time.Second)
		if ae.Status != http.StatusTooManyRequests || attempt >= c.retries || wait > c.maxWait {
			return nil, ae
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("sprites: exec: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// run runs cmd in the sprite and returns its result. When ctx ends first
// the session is killed through the kill route (the vendor would keep a
// non-TTY command running for a while after a disconnect, sheet §9).
func (c *client) run(ctx context.Context, name string, cmd wsCommand) (wsResult, error) {
	conn, err := c.dial(ctx, name, cmd)
	if err != nil {
		return wsResult{}, err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(readLimit)

	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	msgs := make(chan wsMessage, 4)
	go func() { // exits when the connection closes (CloseNow above)
		for {
			typ, data, err := conn.Read(lctx)
			select {
			case msgs <- wsMessage{typ, data, err}:
			case <-lctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // stdin, then stdin EOF; exits with the connection
		for b := cmd.stdin; len(b) > 0; {
			n := min(len(b), stdinChunk)
			frame := append([]byte{streamStdin}, b[:n]...)
			if conn.Write(lctx, websocket.MessageBinary, frame) != nil {
				return
			}
			b = b[n:]
		}
		conn.Write(lctx, websocket.MessageBinary, []byte{streamStdinEOF})
	}()
	go tick.Every(lctx, pingEvery, func() bool { // keepalive; exits with the connection
		pctx, cancel := context.WithTimeout(lctx, 10*time.Second)
		err := conn.Ping(pctx)
		cancel()
		if err != nil && lctx.Err() == nil {
			// No pong: the connection is dead (sprites-go's read
			// deadline is 45s); the reader then ends the command
			// with errNoExit.
			conn.CloseNow()
			return false
		}
		return true
	})

	var (
		out     wsResult
		session string
		kill    <-chan time.Time
		giveUp  <-chan time.Time
	)
	if cmd.killAfter > 0 {
		t := time.NewTimer(cmd.killAfter)
		defer t.Stop()
		kill = t.C
	}
	keep := func(dst *[]byte, n *int64, trunc *bool, b []byte) {
		*n += int64(len(b))
		if room := cmd.max - int64(len(*dst)); room > 0 {
			*dst = append(*dst, b[:min(int64(len(b)), room)]...)
		}
		*trunc = *n > cmd.max
	}
	killSession := func() {
		if session == "" {
			return // closing the socket leaves it to the vendor's disconnect timer
		}
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupLimit)
		defer cancel()
		_ = c.killSession(kctx, name, session, "KILL")
	}
	// stop ends a command whose request is gone: TERM first, which the
	// guest's timeout wrapper forwards to the command's whole process
	// group (and escalates to KILL after its -k), then KILL through the
	// route if no exit came within termWait.
	stop := func() {
		t := time.NewTimer(termWait)
		defer t.Stop()
		// A request canceled before the session's id arrived waits for
		// it (at most termWait), so that the command is ended, not left
		// running until the vendor's disconnect timer.
		for session == "" {
			select {
			case m := <-msgs:
				if m.err != nil || isExit(m) {
					return
				}
				if id, ok := sessionInfo(m); ok {
					session = id
				}
			case <-t.C:
				return // closing the socket leaves it to the vendor's disconnect timer
			}
		}
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupLimit)
		defer cancel()
		_ = c.killSession(kctx, name, session, "TERM")
		t.Reset(termWait) // no stale tick: Go 1.23's timers drop it
		for {
			select {
			case m := <-msgs:
				if m.err != nil || isExit(m) {
					return
				}
			case <-t.C:
				_ = c.killSession(kctx, name, session, "KILL")
				return
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			stop()
			return wsResult{}, fmt.Errorf("sprites: exec: %w", context.Cause(ctx))
		case <-kill:
			kill = nil
			out.killed = true
			killSession()
			t := time.NewTimer(exitWait)
			defer t.Stop()
			giveUp = t.C
		case <-giveUp:
			out.res.ExitCode = 137
			return out, nil
		case m := <-msgs:
			if m.err != nil {
				if out.killed {
					out.res.ExitCode = 137
					return out, nil
				}
				return wsResult{}, errNoExit
			}
			if m.typ == websocket.MessageText {
				if strings.HasPrefix(string(m.data), "control:") {
					continue
				}
				var tm textMessage
				if json.Unmarshal(m.data, &tm) != nil {
					continue
				}
				switch tm.Type {
				case "session_info":
					session = sessionID(tm.SessionID)
				case "exit":
					if tm.ExitCode != nil {
						out.res.ExitCode = *tm.ExitCode
						conn.Close(websocket.StatusNormalClosure, "")
						return out, nil
					}
				}
				continue
			}
			if len(m.data) == 0 {
				continue
			}
			r := &out.res
			switch m.data[0] {
			case streamStdout:
				keep(&r.Stdout, &r.StdoutBytes, &r.StdoutTruncated, m.data[1:])
			case streamStderr:
				keep(&r.Stderr, &r.StderrBytes, &r.StderrTruncated, m.data[1:])
			case streamExit:
				// payload[0] is the code; an empty payload means 0.
				if len(m.data) > 1 {
					r.ExitCode = int(m.data[1])
				}
				conn.Close(websocket.StatusNormalClosure, "")
				return out, nil
			}
		}
	}
}
