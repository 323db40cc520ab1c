package flysprites

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wireServer serves one exec WebSocket with serve, after checking the
// upgrade request with check.
func wireServer(t *testing.T, check func(r *http.Request), serve func(ctx context.Context, c *websocket.Conn)) *client {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if check != nil {
			check(r)
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		serve(r.Context(), c)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return &client{base: u, token: "tok-wire", hc: srv.Client(), timeout: 10 * time.Second, retries: 3, maxWait: time.Minute}
}

// TestExecWire checks the frame layout both ways (sheet §5.2): the query
// of the upgrade, stdin frames then the EOF frame, output demultiplexed by
// stream id, the exit as binary frame 3 or as the text message, a string
// or numeric session id, and control messages ignored.
func TestExecWire(t *testing.T) {
	var gotQuery url.Values
	var gotAuth string
	c := wireServer(t, func(r *http.Request) {
		gotQuery, gotAuth = r.URL.Query(), r.Header.Get("Authorization")
	}, func(ctx context.Context, c *websocket.Conn) {
		var stdin []byte
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if b[0] == streamStdinEOF {
				break
			}
			stdin = append(stdin, b[1:]...)
		}
		c.Write(ctx, websocket.MessageText, []byte(`{"type":"session_info","session_id":"s-1","tty":false}`))
		c.Write(ctx, websocket.MessageText, []byte(`control:{"whatever":1}`))
		c.Write(ctx, websocket.MessageText, []byte(`{"type":"port_opened","port":8080,"address":"0.0.0.0","pid":7}`))
		c.Write(ctx, websocket.MessageBinary, append([]byte{streamStdout}, stdin...))
		c.Write(ctx, websocket.MessageBinary, []byte{streamStderr, 'e', 'r', 'r'})
		c.Write(ctx, websocket.MessageBinary, []byte{streamExit, 42})
		c.Close(websocket.StatusNormalClosure, "")
	})
	in := make([]byte, 100<<10) // several stdin frames
	for i := range in {
		in[i] = byte(i)
	}
	r, err := c.run(t.Context(), "sg-x", wsCommand{argv: []string{"printf", "a b", ""}, env: []string{"A=1", "B=x y"}, dir: "/tmp", stdin: in, max: 10})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if r.res.ExitCode != 42 || string(r.res.Stdout) != string(in[:10]) || r.res.StdoutBytes != int64(len(in)) || !r.res.StdoutTruncated || string(r.res.Stderr) != "err" {
		t.Errorf("result = %+v; want exit 42, 10 of %d stdin bytes echoed, stderr %q", r.res, len(in), "err")
	}
	if !slices.Equal(gotQuery["cmd"], []string{"printf", "a b", ""}) || gotQuery.Get("path") != "printf" ||
		!slices.Equal(gotQuery["env"], []string{"A=1", "B=x y"}) || gotQuery.Get("dir") != "/tmp" || gotQuery.Get("stdin") != "true" {
		t.Errorf("query = %v; want cmd×3, path, env×2, dir, stdin=true", gotQuery)
	}
	if gotAuth != "Bearer tok-wire" {
		t.Errorf("Authorization = %q; want the Bearer token", gotAuth)
	}

	// The text exit message, a numeric session id, no stdin: EOF at once.
	c = wireServer(t, func(r *http.Request) { gotQuery = r.URL.Query() }, func(ctx context.Context, c *websocket.Conn) {
		if _, b, err := c.Read(ctx); err != nil || !slices.Equal(b, []byte{streamStdinEOF}) {
			t.Errorf("first frame = %v, %v; want the stdin EOF frame", b, err)
		}
		c.Write(ctx, websocket.MessageText, []byte(`{"type":"session_info","session_id":17,"tty":false}`))
		c.Write(ctx, websocket.MessageText, []byte(`{"type":"exit","exit_code":3}`))
		c.Close(websocket.StatusNormalClosure, "")
	})
	r, err = c.run(t.Context(), "sg-x", wsCommand{argv: []string{"false"}, max: 10})
	if err != nil || r.res.ExitCode != 3 {
		t.Errorf("text exit = %+v, %v; want exit 3", r.res, err)
	}
	if gotQuery.Get("stdin") != "false" || gotQuery.Has("env") || gotQuery.Has("dir") {
		t.Errorf("query = %v; want stdin=false and no env, no dir", gotQuery)
	}
	if sessionID([]byte(`17`)) != "17" || sessionID([]byte(`"s-1"`)) != "s-1" {
		t.Errorf("sessionID does not take both a number and a string")
	}

	// An empty exit payload means 0.
	c = wireServer(t, nil, func(ctx context.Context, c *websocket.Conn) {
		c.Read(ctx)
		c.Write(ctx, websocket.MessageBinary, []byte{streamExit})
		c.Close(websocket.StatusNormalClosure, "")
	})
	if r, err := c.run(t.Context(), "sg-x", wsCommand{argv: []string{"true"}}); err != nil || r.res.ExitCode != 0 {
		t.Errorf("empty exit payload = %+v, %v; want exit 0", r.res, err)
	}

	// A close without any exit is unknown, never a success.
	c = wireServer(t, nil, func(ctx context.Context, c *websocket.Conn) {
		c.Read(ctx)
		c.Write(ctx, websocket.MessageBinary, []byte{streamStdout, 'x'})
		c.Close(websocket.StatusNormalClosure, "")
	})
	if r, err := c.run(t.Context(), "sg-x", wsCommand{argv: []string{"true"}, max: 10}); !errors.Is(err, errNoExit) {
		t.Errorf("close without exit = %+v, %v; want errNoExit", r.res, err)
	}
}

// TestExecUpgradeErrors: a refused upgrade carries the vendor's status and
// code, and a 429 is retried after retry_after_seconds.
func TestExecUpgradeErrors(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":"rate_limited","retry_after_seconds":1}`))
		case 2:
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			c.Read(r.Context())
			c.Write(r.Context(), websocket.MessageBinary, []byte{streamExit, 5})
			c.Close(websocket.StatusNormalClosure, "")
		default:
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":"sprite_not_found","message":"no sprite"}`))
		}
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	c := &client{base: u, token: "t", hc: srv.Client(), timeout: 10 * time.Second, retries: 3, maxWait: time.Minute}
	start := time.Now()
	r, err := c.run(t.Context(), "sg-x", wsCommand{argv: []string{"true"}})
	if err != nil || r.res.ExitCode != 5 || time.Since(start) < time.Second {
		t.Errorf("after a 429: %+v, %v after %v; want exit 5 after at least 1s", r.res, err, time.Since(start))
	}
	_, err = c.run(t.Context(), "sg-x", wsCommand{argv: []string{"true"}})
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound || ae.Code != "sprite_not_found" {
		t.Errorf("refused upgrade = %v; want status 404, code sprite_not_found", err)
	}
}
