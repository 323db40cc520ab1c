package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/protocol"
)

func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want int64
	}{
		{0, 1},
		{time.Nanosecond, 1},
		{500 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{1500 * time.Millisecond, 2},
		{30 * time.Second, 30},
		{-time.Second, 1},
	}
	for _, tt := range tests {
		if got := httpapi.RetryAfterSeconds(tt.in); got != tt.want {
			t.Errorf("RetryAfterSeconds(%v) = %d; want %d", tt.in, got, tt.want)
		}
	}
}

type body struct {
	Label string   `json:"label"`
	Argv  []string `json:"argv"`
}

func TestDecode(t *testing.T) {
	const limit = 1 << 20
	tests := []struct {
		name string
		in   string
		want protocol.Code // "" when the body decodes
	}{
		{"ok", `{"label":"a","argv":["x"]}`, ""},
		{"unknown field", `{"label":"a","colour":"red"}`, protocol.InvalidRequest},
		{"field in another case", `{"Label":"a"}`, protocol.InvalidRequest},
		{"trailing object", `{"label":"a"}{}`, protocol.InvalidRequest},
		{"trailing garbage", `{"label":"a"} x`, protocol.InvalidRequest},
		{"null element", `{"argv":[null]}`, protocol.InvalidRequest},
		{"wrong type", `{"label":3}`, protocol.InvalidRequest},
		{"not json", `{"label":`, protocol.InvalidRequest},
		{"empty", ``, protocol.InvalidRequest},
		{"over size", `{"label":"` + strings.Repeat("a", limit) + `"}`, protocol.PayloadTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.in))
			r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, limit)
			var v body
			err := httpapi.Decode(r, &v, limit)
			if got := protocol.CodeOf(err); got != tt.want {
				t.Fatalf("Decode(%.40q) code = %q (%v); want %q", tt.in, got, err, tt.want)
			}
			if err == nil {
				return
			}
			// The message is the broker's own: never encoding/json's
			// text (which names Go types and offsets).
			msg := err.(*protocol.Error).Message
			for _, leak := range []string{"json:", "Go struct", "offset", "httpapi_test", "invalid character"} {
				if strings.Contains(msg, leak) {
					t.Errorf("Decode(%.40q) message = %q; must not contain %q", tt.in, msg, leak)
				}
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	tests := []struct {
		name       string
		method     string
		pe         *protocol.Error
		wantBody   string
		wantRetry  string
		wantStatus int
	}{
		{
			name: "plain", method: http.MethodGet,
			pe:       protocol.E(protocol.NotFound, "no such workspace"),
			wantBody: `{"error":{"code":"not_found","message":"no such workspace","retryable":false,"details":{}}}` + "\n", wantStatus: 404,
		},
		{
			name: "reason and retry", method: http.MethodPost,
			pe:        &protocol.Error{Code: protocol.Unavailable, Message: "retry", Reason: "why", RetryAfter: 1500 * time.Millisecond},
			wantBody:  `{"error":{"code":"unavailable","message":"retry","retryable":true,"details":{"reason":"why"}}}` + "\n",
			wantRetry: "2", wantStatus: 503,
		},
		{
			name: "head", method: http.MethodHead,
			pe:       protocol.E(protocol.NotFound, "no such workspace"),
			wantBody: "", wantStatus: 404,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			httpapi.WriteError(w, httptest.NewRequest(tt.method, "/", nil), tt.pe.Code.Status(), tt.pe)
			if w.Code != tt.wantStatus {
				t.Errorf("status = %d; want %d", w.Code, tt.wantStatus)
			}
			if got := w.Body.String(); got != tt.wantBody {
				t.Errorf("body = %q; want %q", got, tt.wantBody)
			}
			if got := w.Header().Get(protocol.HeaderRetryAfter); got != tt.wantRetry {
				t.Errorf("Retry-After = %q; want %q", got, tt.wantRetry)
			}
		})
	}
}

func TestRequestIDs(t *testing.T) {
	var ids httpapi.RequestIDs
	seen := map[string]bool{}
	for range 3 * httpapi.RequestIDBlock {
		id := ids.NewID()
		if !strings.HasPrefix(id, "req_") || len(id) != len("req_")+24 || seen[id] {
			t.Fatalf("NewID() = %q; want a new req_ and 24 hex digits", id)
		}
		seen[id] = true
	}
	h := http.Header{}
	h.Set(protocol.HeaderRequestID, "bad id\x00")
	if got := httpapi.ClientRequestID(h); got != nil {
		t.Errorf("ClientRequestID(invalid) = %q; want nil", got)
	}
}
