package gateway_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// TestFilesStreamed checks files/write as it streams its body into the
// provider: either order of the fields works, the two 413s keep their
// limits, and a refused body never replaces the file, even when its fault
// comes after the contents the provider has started to read.
func TestFilesStreamed(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	const max = 8 << 20
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxFileBytes: max}})
	ws := acquire(t, h, in.Token, "stream")
	writePath, readPath := wsPath(ws.WorkspaceID, "/files/write"), wsPath(ws.WorkspaceID, "/files/read")
	post := func(path string, body any) reply {
		return do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token, Body: body})
	}
	readBack := func(name string) string {
		t.Helper()
		var got protocol.ReadFileResponse
		wantOK(t, "read "+name, post(readPath, protocol.ReadFileRequest{Path: name}), http.StatusOK, &got)
		b, err := base64.StdEncoding.DecodeString(got.ContentsB64)
		if err != nil || int64(len(b)) != got.SizeBytes {
			t.Fatalf("read %s: %d bytes of base64 (%v), size_bytes %d", name, len(got.ContentsB64), err, got.SizeBytes)
		}
		return string(b)
	}
	const file = "/workspace/s.txt"
	b64 := base64.StdEncoding.EncodeToString

	wantOK(t, "write, path first", post(writePath, `{"path":"`+file+`","contents_b64":"`+b64([]byte("first"))+`"}`), http.StatusNoContent, nil)
	if got := readBack(file); got != "first" {
		t.Errorf("after a write with the path first: %q; want %q", got, "first")
	}
	wantOK(t, "write, contents first", post(writePath, `{"contents_b64":"`+b64([]byte("second"))+`","path":"`+file+`"}`), http.StatusNoContent, nil)
	if got := readBack(file); got != "second" {
		t.Errorf("after a write with the contents first: %q; want %q", got, "second")
	}
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB, several decoder blocks
	wantOK(t, "write of 1 MiB", post(writePath, protocol.WriteFileRequest{Path: file, ContentsB64: b64([]byte(big))}), http.StatusNoContent, nil)
	if got := readBack(file); got != big {
		t.Errorf("after a write of 1 MiB: %d bytes; want the %d written", len(got), len(big))
	}

	refused := []struct {
		name   string
		body   any
		status int
		code   protocol.Code
	}{
		{"unknown field after the contents", `{"path":"` + file + `","contents_b64":"` + b64([]byte("third")) + `","mode":420}`,
			http.StatusBadRequest, protocol.InvalidRequest},
		{"invalid base64 at the end", `{"path":"` + file + `","contents_b64":"` + b64([]byte(big)) + `!"}`,
			http.StatusBadRequest, protocol.InvalidRequest},
		{"body cut short", `{"path":"` + file + `","contents_b64":"` + b64([]byte("third")),
			http.StatusBadRequest, protocol.InvalidRequest},
		{"trailing data", `{"path":"` + file + `","contents_b64":"` + b64([]byte("third")) + `"} {}`,
			http.StatusBadRequest, protocol.InvalidRequest},
		{"contents one byte over max_file_bytes", protocol.WriteFileRequest{Path: file, ContentsB64: b64(make([]byte, max+1))},
			http.StatusRequestEntityTooLarge, protocol.FileTooLarge},
		// Without a Content-Length: the limit is found while streaming, and
		// wins over max_file_bytes, which the contents are over too.
		{"body over 12 MiB", io.MultiReader(strings.NewReader(`{"path":"` + file + `","contents_b64":"` + b64(make([]byte, 9<<20)) + `"}`)),
			http.StatusRequestEntityTooLarge, protocol.PayloadTooLarge},
	}
	for _, tt := range refused {
		wantError(t, tt.name, post(writePath, tt.body), tt.status, tt.code)
		if got := readBack(file); got != big {
			t.Errorf("after a refused write (%s): %d bytes; want the %d before", tt.name, len(got), len(big))
		}
	}
	wantOK(t, "contents of exactly max_file_bytes", post(writePath, protocol.WriteFileRequest{Path: file, ContentsB64: b64(make([]byte, max))}),
		http.StatusNoContent, nil)
	if got := readBack(file); len(got) != max {
		t.Errorf("after a write of max_file_bytes: %d bytes; want %d", len(got), max)
	}
	waitInflight(t, h, 0)
	if st := h.Gateway.InflightStats(); st.Bytes != 0 {
		t.Errorf("bytes reserved after the transfers = %d; want 0", st.Bytes)
	}
}
