package spritetest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// Frame ids of the non-TTY layout (sheet §5.2).
const (
	idStdin    = 0
	idStdout   = 1
	idStderr   = 2
	idExit     = 3
	idStdinEOF = 4
)

// signals the kill route accepts (sheet §3).
var signals = map[string]bool{"INT": true, "TERM": true, "HUP": true, "KILL": true, "QUIT": true, "USR1": true, "USR2": true}

// exec serves GET /v1/sprites/{name}/exec: a WebSocket upgrade runs a
// command (sheet §5); plain HTTP lists the sessions (sheet §5.4).
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		sp.mu.Lock()
		sessions := []map[string]any{}
		for id, j := range sp.sessions {
			sessions = append(sessions, map[string]any{"id": id, "command": "", "workdir": "", "created": time.Now(),
				"bytes_per_second": 0, "is_active": !isDone(j), "tty": false})
		}
		sp.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"sessions": sessions})
		return
	}
	q := r.URL.Query()
	argv := q["cmd"]
	if len(argv) == 0 {
		apiErr(w, http.StatusBadRequest, "invalid_request", "cmd is required")
		return
	}
	if p := q.Get("path"); p != "" && p != argv[0] {
		apiErr(w, http.StatusBadRequest, "invalid_request", "path must be the first cmd")
		return
	}
	if q.Get("tty") == "true" {
		apiErr(w, http.StatusBadRequest, "invalid_request", "the fake runs no TTY sessions")
		return
	}
	var env []string
	if vs, ok := q["env"]; ok {
		env = vs
		for _, kv := range vs {
			if !strings.Contains(kv, "=") {
				apiErr(w, http.StatusBadRequest, "invalid_request", "env must be KEY=VALUE")
				return
			}
		}
	}
	wantStdin := q.Get("stdin") == "true"
	after := 10 * time.Second // docs: the non-TTY default of max_run_after_disconnect
	if v := q.Get("max_run_after_disconnect"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			apiErr(w, http.StatusBadRequest, "invalid_request", "max_run_after_disconnect")
			return
		}
		after = d
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(2 << 20)
	ctx := context.Background()

	// Stdin frames until the EOF frame; then the command starts with it.
	var stdin []byte
	gone := make(chan struct{}) // the client went away
	eof := make(chan struct{})
	go func() {
		defer close(gone)
		sawEOF := false
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ != websocket.MessageBinary || len(data) == 0 || sawEOF {
				continue
			}
			switch data[0] {
			case idStdin:
				if wantStdin {
					stdin = append(stdin, data[1:]...)
				}
			case idStdinEOF:
				sawEOF = true
				close(eof)
			}
		}
	}()
	if wantStdin {
		select {
		case <-eof:
		case <-gone:
			return
		}
	}
	s.record(sp.name, Event{Kind: "exec", Argv: argv})
	j, err := sp.start(argv, env, q.Get("dir"), stdin)
	if err != nil {
		conn.Close(websocket.StatusInternalError, "the command did not start")
		return
	}
	defer sp.remove(j)
	s.mu.Lock()
	s.nextSID++
	sid := s.nextSID
	s.mu.Unlock()
	j.session = strconv.Itoa(sid)
	sp.mu.Lock()
	sp.sessions[j.session] = j
	sp.mu.Unlock()
	if s.infoDelay > 0 {
		time.Sleep(s.infoDelay)
	}
	// session_id as a number, as the docs show it (sheet §5.2).
	info, _ := json.Marshal(map[string]any{"type": "session_info", "session_id": sid, "tty": false})
	if conn.Write(ctx, websocket.MessageText, info) != nil {
		sp.killAfter(j, after)
		return
	}

	// Stream the output files until the exit file, then the rest.
	var offs [2]int64
	stream := func() bool {
		for i, name := range []string{"out", "err"} {
			f, err := os.Open(filepath.Join(j.dir, name))
			if err != nil {
				continue
			}
			buf := make([]byte, 32<<10)
			for {
				n, err := f.ReadAt(buf, offs[i])
				if n > 0 {
					offs[i] += int64(n)
					if conn.Write(ctx, websocket.MessageBinary, append([]byte{byte(idStdout + i)}, buf[:n]...)) != nil {
						f.Close()
						return false
					}
				}
				if err == io.EOF || n == 0 {
					break
				}
			}
			f.Close()
		}
		return true
	}
	for {
		select {
		case <-gone:
			sp.killAfter(j, after)
			return
		case <-j.done:
			if !stream() {
				return
			}
			// The exit: binary frame 3 for even sessions, the text exit
			// message for odd ones, so that clients meet both forms.
			if sid%2 == 0 {
				payload := []byte{idExit}
				if j.code != 0 {
					payload = append(payload, byte(j.code))
				}
				conn.Write(ctx, websocket.MessageBinary, payload)
			} else {
				msg, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": j.code})
				conn.Write(ctx, websocket.MessageText, msg)
			}
			conn.Close(websocket.StatusNormalClosure, "")
			return
		case <-time.After(10 * time.Millisecond):
			if !stream() {
				sp.killAfter(j, after)
				return
			}
		}
	}
}

func isDone(j *job) bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// killAfter kills a job whose client went away once d has passed, as the
// vendor does for non-TTY sessions; it waits for the end (at most a minute).
func (sp *sprite) killAfter(j *job, d time.Duration) {
	select {
	case <-j.done:
		return
	case <-time.After(d):
	}
	sp.signal(j, "KILL")
	select {
	case <-j.done:
	case <-time.After(time.Minute):
	}
}

// kill serves POST …/exec/{session}/kill?signal=NAME&timeout=0s: 200, or
// 410 when the session had already exited.
func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	sig := r.URL.Query().Get("signal")
	if !signals[sig] {
		apiErr(w, http.StatusBadRequest, "invalid_signal", "unknown signal")
		return
	}
	sp.mu.Lock()
	j, ok := sp.sessions[r.PathValue("session")]
	sp.mu.Unlock()
	if !ok {
		apiErr(w, http.StatusNotFound, "session_not_found", "no such session")
		return
	}
	if !sp.signal(j, sig) {
		apiErr(w, http.StatusGone, "session_exited", "the session has exited")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "signaled"})
}
