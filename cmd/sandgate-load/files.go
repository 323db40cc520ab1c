package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/protocol"
)

// runFiles measures the broker's memory under file transfers: c clients
// at once, each writing a file of size bytes and reading it back (once),
// against a real `sandgate dev`, with the default in-flight caps (one
// workspace per 8 clients, the per-workspace cap). It reports the broker
// process's peak RSS (VmHWM, reset before the load) and its RSS 5 s after,
// each against the bytes in flight (c × size), and fails when the peak is
// over 3 × that. With before, it first measures the broker of that
// revision the same way, in the same run (`sandgate dev` takes no config:
// both run with the default caps, under which a broker that reserves more
// per transfer holds fewer at once and answers the rest 503, retried).
func runFiles(ctx context.Context, bin, before string, c int, size int64) error {
	if c < 1 || size < 1 || size > 9<<20 {
		return errors.New("-c must be at least 1 and -size between 1 and 9 MiB (the 12 MiB body holds 9 MiB of base64)")
	}
	dir, bin, err := workDir(ctx, "sandgate-load-", bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	inflight := float64(int64(c) * size)
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Printf("workload: %d clients at once, each writing a file of %d bytes then reading it back; bytes in flight %.1f MiB; default in-flight caps\n\n",
		c, size, inflight/(1<<20))
	fmt.Printf("| broker | RSS at rest | peak RSS | 5 s after | peak ÷ in flight | (peak − rest) ÷ in flight | after ÷ in flight | refusals retried (of which 503) | wall |\n")
	fmt.Printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	row := func(name string, f fileFigures) {
		fmt.Printf("| %s | %.1f MiB | %.1f MiB | %.1f MiB | %.2f | %.2f | %.2f | %d (%d) | %s |\n", name, mib(f.idle), mib(f.peak), mib(f.after),
			float64(f.peak)/inflight, float64(f.peak-f.idle)/inflight, float64(f.after)/inflight, f.refusals, f.unavailable, f.elapsed.Round(time.Millisecond))
	}
	if before != "" {
		oldBin, err := buildBefore(ctx, dir, before)
		if err != nil {
			return err
		}
		f, err := measureFiles(ctx, oldBin, filepath.Join(dir, "data-before"), c, size)
		if err != nil {
			return fmt.Errorf("before (%s): %w", before, err)
		}
		row("before ("+before+")", f)
	}
	f, err := measureFiles(ctx, bin, filepath.Join(dir, "data"), c, size)
	if err != nil {
		return err
	}
	row("now", f)
	if ratio := float64(f.peak) / inflight; ratio > 3 {
		return fmt.Errorf("peak RSS %.2f × the bytes in flight; want at most 3", ratio)
	}
	return nil
}

// fileFigures are one broker's figures under the file workload.
type fileFigures struct {
	idle, peak, after int64 // bytes
	refusals          int64 // 429 and 503 retried
	unavailable       int64 // of which 503
	elapsed           time.Duration
}

func measureFiles(ctx context.Context, bin, dataDir string, c int, size int64) (fileFigures, error) {
	var f fileFigures
	b, err := startDev(ctx, bin, dataDir)
	if err != nil {
		return f, err
	}
	defer b.stop()
	pid := b.cmd.Process.Pid
	var wss []string
	for i := range (c + 7) / 8 {
		ws, release, err := b.acquire(ctx, "files-"+strconv.Itoa(i))
		if err != nil {
			return f, err
		}
		wss = append(wss, ws)
		defer release()
	}
	content := make([]byte, size)
	for i := range content {
		content[i] = byte(i*131 + i>>9)
	}
	b64 := base64.StdEncoding.EncodeToString(content)
	cycle := func(ws string, n int) (int64, error) {
		path := "/workspace/load-" + strconv.Itoa(n) + ".bin"
		wb, err := json.Marshal(protocol.WriteFileRequest{Path: path, ContentsB64: b64})
		if err != nil {
			return 0, err
		}
		r1, err := b.transfer(ctx, ws, "/files/write", wb, nil)
		if err != nil {
			return r1, fmt.Errorf("write: %w", err)
		}
		var got protocol.ReadFileResponse
		rb, _ := json.Marshal(protocol.ReadFileRequest{Path: path})
		r2, err := b.transfer(ctx, ws, "/files/read", rb, &got)
		if err != nil {
			return r1 + r2, fmt.Errorf("read: %w", err)
		}
		if got.ContentsB64 != b64 || got.SizeBytes != size {
			return r1 + r2, errors.New("read back other bytes than written")
		}
		return r1 + r2, nil
	}
	// Warm up, settle, measure at rest.
	if _, err := cycle(wss[0], -1); err != nil {
		return f, fmt.Errorf("warm-up: %w", err)
	}
	time.Sleep(2 * time.Second)
	if f.idle, err = status(pid, "VmRSS"); err != nil {
		return f, err
	}
	if err := resetPeak(pid); err != nil {
		return f, err
	}
	start := time.Now()
	f.refusals, err = concurrently(c, func(i int) (int64, error) { return cycle(wss[i%len(wss)], i) })
	f.elapsed, f.unavailable = time.Since(start), b.unavailable.Load()
	if err != nil {
		return f, err
	}
	if f.peak, err = status(pid, "VmHWM"); err != nil {
		return f, err
	}
	time.Sleep(5 * time.Second)
	f.after, err = status(pid, "VmRSS")
	return f, err
}

// transfer posts body to a workspace's file route, retrying a 429 or 503
// after its Retry-After, and decodes a 200 into out. It returns the
// refusals it retried.
func (b *broker) transfer(ctx context.Context, ws, route string, body []byte, out any) (int64, error) {
	var refused int64
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/workspaces/"+ws+route, bytes.NewReader(body))
		if err != nil {
			return refused, err
		}
		req.Header.Set("Authorization", "Bearer "+b.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.hc.Do(req)
		if err != nil {
			return refused, err
		}
		switch resp.StatusCode {
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			readClose(resp.Body)
			refused++
			if resp.StatusCode == http.StatusServiceUnavailable {
				b.unavailable.Add(1)
			}
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			select {
			case <-ctx.Done():
				return refused, ctx.Err()
			case <-time.After(time.Duration(max(wait, 1)) * time.Second):
			}
			continue
		case http.StatusOK, http.StatusNoContent:
			defer readClose(resp.Body)
			if out == nil {
				return refused, nil
			}
			return refused, json.NewDecoder(resp.Body).Decode(out)
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		readClose(resp.Body)
		return refused, fmt.Errorf("status %d: %.500s", resp.StatusCode, msg)
	}
}
