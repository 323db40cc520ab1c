package main

// The -acquire floor: what two HTTPS requests per pair cost on this
// machine with nothing behind them. A process of its own (this binary run
// with -floor-serve) answers POST /v1/workspaces and DELETE
// /v1/workspaces/{id} over TLS with net/http, sending back the very bodies
// the broker answered in the warm-up, so the same clients send and read
// the same bytes. No broker, however fast its admission and its Redis,
// serves more pairs per second than this server does on the same host: its
// rate ÷ EVALSHA bounds the ratio any broker can reach here.

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

const (
	floorAcquireFile = "floor-acquire.json"
	floorReleaseFile = "floor-release.json"
)

// runFloorServe serves the floor on addr until it is killed, with the
// certificate and bodies that -acquire wrote into dir.
func runFloorServe(addr, dir string) error {
	acq, err := os.ReadFile(filepath.Join(dir, floorAcquireFile))
	if err != nil {
		return err
	}
	rel, err := os.ReadFile(filepath.Join(dir, floorReleaseFile))
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		return err
	}
	answer := func(w http.ResponseWriter, r *http.Request, status int, body []byte) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/workspaces", func(w http.ResponseWriter, r *http.Request) { answer(w, r, http.StatusCreated, acq) })
	mux.HandleFunc("DELETE /v1/workspaces/{id}", func(w http.ResponseWriter, r *http.Request) { answer(w, r, http.StatusOK, rel) })
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	return srv.ListenAndServeTLS("", "")
}

// floor is the running floor server, with a client like the broker's.
type floor struct {
	cmd *exec.Cmd
	*serve
}

// startFloor writes the broker's answers from one warm-up pair into dir and
// starts the floor server beside the broker.
func startFloor(ctx context.Context, dir string, s *serve, acq, rel []byte) (*floor, error) {
	if err := os.WriteFile(filepath.Join(dir, floorAcquireFile), acq, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, floorReleaseFile), rel, 0o600); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	f := &floor{serve: &serve{url: "https://" + addr, token: s.token, hc: newLoadClient(s.hc)}}
	f.cmd = exec.Command(self, "-floor-serve", addr, "-floor-dir", dir)
	f.cmd.Stdout, f.cmd.Stderr = io.Discard, os.Stderr
	if err := f.cmd.Start(); err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, f.url+"/v1/workspaces/x", nil)
		if resp, err := f.hc.Do(req); err == nil {
			resp.Body.Close()
			return f, nil
		}
		if i == 100 || ctx.Err() != nil {
			f.stop()
			return nil, errors.New("the floor server did not answer within 10s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (f *floor) stop() {
	_ = f.cmd.Process.Kill()
	_ = f.cmd.Wait()
}

// newLoadClient is a client with the transport settings of c's, and its
// own connections.
func newLoadClient(c *http.Client) *http.Client {
	t := c.Transport.(*http.Transport).Clone()
	return &http.Client{Transport: t}
}
