package gateway

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

// oldWrite is how the gateway took a files/write body before it streamed
// (read whole, decode, validate the path, decode the base64, check the
// size): the reference writeBody must answer like.
func oldWrite(body []byte, maxFileBytes int64) ([]byte, error) {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	rec := httptest.NewRecorder()
	req.Body = http.MaxBytesReader(rec, req.Body, protocol.MaxBodyBytes)
	c := echo.New().NewContext(req, rec)
	var wr protocol.WriteFileRequest
	if err := decode(c, &wr); err != nil {
		return nil, err
	}
	if err := policy.ValidatePath(wr.Path); err != nil {
		return nil, err
	}
	data, err := decodeB64("contents_b64", wr.ContentsB64)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxFileBytes {
		return nil, errContentsSize
	}
	return data, nil
}

// newWrite takes the body through writeBody as the handler does, reading
// the provider's side in small pieces.
func newWrite(body []byte, maxFileBytes int64, chunked bool) ([]byte, error) {
	rec := httptest.NewRecorder()
	var r io.Reader = bytes.NewReader(body)
	cl := int64(len(body))
	if chunked {
		r, cl = io.MultiReader(r), -1
	}
	b := newWriteBody(http.MaxBytesReader(rec, io.NopCloser(r), protocol.MaxBodyBytes), cl, maxFileBytes)
	stream := b.head()
	if b.err != nil {
		return nil, b.err
	}
	var src io.Reader = b
	if !stream {
		src = &fileBuf{}
		if b.held != nil {
			src = b.held
		}
	}
	var got bytes.Buffer
	buf := make([]byte, 1000)
	for {
		n, err := src.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if err := b.finish(); err != nil {
		return nil, err
	}
	if got.Len() > int(maxFileBytes) {
		return nil, errors.New("passed on more than max_file_bytes")
	}
	return got.Bytes(), nil
}

func TestWriteBodyAsDecode(t *testing.T) {
	const max = 3000
	data := make([]byte, 2999)
	for i := range data {
		data[i] = byte(i * 7)
	}
	enc := base64.StdEncoding.EncodeToString
	big := enc(data)
	bodies := []string{
		`{"path":"/w/f","contents_b64":"` + big + `"}`,
		`{"contents_b64":"` + big + `","path":"/w/f"}`,
		` { "path" : "/w/f" , "contents_b64" : "` + big + `" } ` + "\n",
		`{"path":"/w/f","contents_b64":"` + enc(append(data, 1)) + `"}`,
		`{"path":"/w/f","contents_b64":"` + enc(append(data, 1, 2)) + `"}`,
		`{"contents_b64":"` + enc(append(data, 1, 2)) + `","path":"/w/f"}`,
		`{"path":"/w/f","contents_b64":"` + strings.ReplaceAll(big, "/", `\/`) + `"}`,
		`{"path":"/w/f","contents_b64":"\u0061GVsbG8="}`,
		`{"path":"/w/f","contents_b64":""}`,
		`{"path":"/w/f"}`,
		`{"path":"\/w\/f","contents_b64":"aGk="}`,
		`{"contents_b64":"aGk="}`,
		`{}`,
		``,
		`   `,
		`null`,
		`[]`,
		`"x"`,
		`5`,
		`{`,
		`{"path"`,
		`{"path":`,
		`{"path":"/w/f"`,
		`{"path":"/w/f",`,
		`{"path":"/w/f",}`,
		`{"path":"/w/f","contents_b64":"aGk=`,
		`{"path":"/w/f","contents_b64":"aGk="`,
		`{"path":"/w/f","contents_b64":"aGk="}}`,
		`{"path":"/w/f","contents_b64":"aGk="} {}`,
		`{"path":"/w/f","contents_b64":"aGk="} x`,
		`{"path":"/w/f","contents_b64":"aGk=","mode":1}`,
		`{"mode":1,"path":"/w/f"}`,
		`{"Path":"/w/f"}`,
		`{"path":null,"contents_b64":"aGk="}`,
		`{"path":"/w/f","contents_b64":null}`,
		`{"path":5,"contents_b64":"aGk="}`,
		`{"path":"/w/f","contents_b64":5}`,
		`{"path":"/w/f","contents_b64":true}`,
		`{"path":"/w/f","contents_b64":["aGk="]}`,
		`{"path":"rel","contents_b64":"aGk="}`,
		`{"path":"","contents_b64":"aGk="}`,
		`{"path":"/w/\u0000","contents_b64":"aGk="}`,
		`{"path":"/` + strings.Repeat("p", 4095) + `","contents_b64":"aGk="}`,
		`{"path":"/` + strings.Repeat("p", 4096) + `","contents_b64":"aGk="}`,
		`{"path":"/w/f","contents_b64":"not base64!"}`,
		`{"path":"/w/f","contents_b64":"YQ"}`,
		`{"path":"/w/f","contents_b64":"YQ==YQ=="}`,
		`{"path":"/w/f","contents_b64":"` + big[:len(big)-4] + `YQ==` + big[len(big)-4:] + `"}`,
		`{"path":"/w/f","contents_b64":"YR=="}`,
		`{"path":"/w/f","contents_b64":"aGVs\nbG8K"}`,
		`{"path":"/w/f","contents_b64":"\naGVsbG8K"}`,
		`{"path":"/w/f","contents_b64":"aGVsbG8K\r"}`,
		`{"path":"/w/f","contents_b64":"aGVs\u000abG8K"}`,
		`{"path":"/w/f","contents_b64":"aGVs\tbG8K"}`,
		"{\"path\":\"/w/f\",\"contents_b64\":\"aGVs\nbG8K\"}",
		"{\"path\":\"/w/f\",\"contents_b64\":\"aGVs\xffbG8K\"}",
		"{\"path\":\"/w/f\",\"contents_b64\":\"aGVsé\"}",
		`{"path":"/w/f","contents_b64":"aGVs\ud83dbG8K"}`,
		`{"path":"/w/f","contents_b64":"aGVs\ud83d\ude00"}`,
		`{"path":"/w/f","contents_b64":"aGVs\x"}`,
		"{\"path\":\"/workspace/\xff\",\"contents_b64\":\"\"}",
		"{\"path\":\"/\xc0\xaf\"}",
		`{"path":"/w/f","contents_b64":"not base64!","mode":1}`,
		`{"path":"rel","contents_b64":"not base64!"}`,
		`{"path":"/w/f","contents_b64":"` + enc(append(data, 1, 2)) + `","x":1}`,
		`{"path":"/w/f","contents_b64":"` + enc(append(data, 1, 2)) + `!"}`,
	}
	for _, body := range bodies {
		want, wantErr := oldWrite([]byte(body), max)
		if strings.HasPrefix(body, "[") || strings.HasPrefix(body, `"`) || strings.HasPrefix(body, "5") {
			// The one message that differs on purpose: encoding/json named
			// an empty field ("field  has the wrong JSON type").
			wantErr = errInvalid("request body must be a JSON object")
		}
		for _, chunked := range []bool{false, true} {
			got, err := newWrite([]byte(body), max, chunked)
			name := body
			if len(name) > 80 {
				name = name[:40] + "…" + name[len(name)-40:]
			}
			if !sameErr(err, wantErr) {
				t.Errorf("%q (chunked %v): error %v; want %v", name, chunked, err, wantErr)
				continue
			}
			if wantErr == nil && !bytes.Equal(got, want) {
				t.Errorf("%q (chunked %v): %d bytes passed on; want the %d decoded", name, chunked, len(got), len(want))
			}
		}
	}
}

// TestWriteBodyLimits checks the two 413s on bodies near 12 MiB: the body
// as sent (payload_too_large) wins over the decoded contents
// (file_too_large), as when the body was read whole.
func TestWriteBodyLimits(t *testing.T) {
	const max = 8 << 20
	mk := func(decoded int, pad int) []byte {
		return []byte(`{"path":"/w/f","contents_b64":"` + base64.StdEncoding.EncodeToString(make([]byte, decoded)) + `"}` + strings.Repeat(" ", pad))
	}
	exact := mk(max, 0)
	over := mk(max+1, 0)
	overBody := mk(9<<20, 0) // 12 MiB of base64, and the JSON around it
	if len(overBody) <= protocol.MaxBodyBytes {
		t.Fatalf("test body of %d bytes is not over the limit", len(overBody))
	}
	fillBody := mk(max, protocol.MaxBodyBytes-len(exact)) // exactly 12 MiB
	for _, tt := range []struct {
		name string
		body []byte
		want error
	}{
		{"contents of exactly max_file_bytes", exact, nil},
		{"contents one byte over", over, errContentsSize},
		{"body over 12 MiB", overBody, errBodyTooLarge},
		{"body of exactly 12 MiB", fillBody, nil},
	} {
		if _, err := oldWrite(tt.body, max); !sameErr(err, tt.want) {
			t.Errorf("%s: the old path answers %v; want %v", tt.name, err, tt.want)
		}
		for _, chunked := range []bool{false, true} {
			got, err := newWrite(tt.body, max, chunked)
			if !sameErr(err, tt.want) {
				t.Errorf("%s (chunked %v): error %v; want %v", tt.name, chunked, err, tt.want)
			}
			if err == nil && len(got) != max {
				t.Errorf("%s (chunked %v): %d bytes passed on; want %d", tt.name, chunked, len(got), max)
			}
		}
	}
}

func sameErr(got, want error) bool {
	if got == nil || want == nil {
		return got == want
	}
	var g, w *protocol.Error
	if !errors.As(got, &g) || !errors.As(want, &w) {
		return false
	}
	return g.Code == w.Code && g.Message == w.Message
}
