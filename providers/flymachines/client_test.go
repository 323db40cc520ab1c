package flymachines

import (
	"net/http"
	"testing"
)

func TestAuthHeader(t *testing.T) {
	tests := []struct{ in, want string }{
		{"fm2_abc", "FlyV1 fm2_abc"},
		{"FlyV1 fm2_abc", "FlyV1 fm2_abc"},
		{"  flyv1   fm2_a, fm1r_b ", "FlyV1 fm2_a,fm1r_b"},
		{"Bearer FlyV1 fm1a_x", "FlyV1 fm1a_x"},
		{"user1,fm2_x", "FlyV1 fm2_x"}, // user tokens are dropped beside a macaroon
		{"oauth-token", "Bearer oauth-token"},
		{"Bearer u1, u2", "Bearer u1,u2"},
		{"fm2x_notamacaroon", "Bearer fm2x_notamacaroon"},
	}
	for _, tt := range tests {
		if got := authHeader(tt.in); got != tt.want {
			t.Errorf("authHeader(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestWaitDeadline(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{&APIError{StatusCode: http.StatusRequestTimeout}, true},
		{&APIError{StatusCode: http.StatusBadRequest, Message: "deadline_exceeded: timed out waiting"}, true},
		{&APIError{StatusCode: http.StatusBadRequest, Status: "deadline_exceeded"}, true},
		{&APIError{StatusCode: http.StatusBadRequest, Message: "invalid_argument: bad state"}, false},
		// An argument problem about the timeout itself fails too (sheet
		// §1.6: "Fail only on a 400 that names a real argument problem").
		{&APIError{StatusCode: http.StatusBadRequest, Status: "invalid_argument", Message: "timeout must be between 1 and 60 seconds"}, false},
		{&APIError{StatusCode: http.StatusBadRequest, Message: "timeout must be between 1 and 60 seconds"}, false},
		{&APIError{StatusCode: http.StatusBadRequest, Message: "timeout waiting for machine to be started"}, true},
		{&APIError{StatusCode: http.StatusNotFound}, false},
	}
	for _, tt := range tests {
		if got := waitDeadline(tt.err); got != tt.want {
			t.Errorf("waitDeadline(%+v) = %v; want %v", tt.err, got, tt.want)
		}
	}
}

func TestDecodeMachines(t *testing.T) {
	ms, next, err := decodeMachines([]byte(`[{"id":"a","state":"started","config":{"metadata":{"k":"v"}},"unknown":1}]`))
	if err != nil || len(ms) != 1 || next != "" || ms[0].metadata()["k"] != "v" {
		t.Errorf("array: %+v, %q, %v", ms, next, err)
	}
	ms, next, err = decodeMachines([]byte(`{"machines":[{"id":"b","incomplete_config":{"metadata":{"k":"w"}}}],"next_cursor":"c1"}`))
	if err != nil || len(ms) != 1 || next != "c1" || ms[0].metadata()["k"] != "w" {
		t.Errorf("paginated: %+v, %q, %v", ms, next, err)
	}
	if ps := decodePolicies([]byte(`{"policies":[{"name":"p"}]}`)); len(ps) != 1 || ps[0].Name != "p" {
		t.Errorf("wrapped policies: %+v", ps)
	}
	if ps := decodePolicies([]byte(`[{"name":"p"},{"name":"q"}]`)); len(ps) != 2 {
		t.Errorf("policy array: %+v", ps)
	}
}

func TestParseWrapped(t *testing.T) {
	res, err := parseWrapped([]byte("sandgate-exec 3 0 5 0\n/w==\n\n"), 10)
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "\xff" || res.StdoutBytes != 6 || !res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("parseWrapped = %+v, %v", res, err)
	}
	for _, bad := range []string{"", "sandgate-exec 1 0\n\n\n", "sandgate-exec 0 0 0 0\n!!\n\n", "sandgate-exec 0 0 0 0\nYWJj\n\n"} {
		if _, err := parseWrapped([]byte(bad), 2); err == nil {
			t.Errorf("parseWrapped(%q) succeeded; want an error", bad)
		}
	}
}

func TestGuestFor(t *testing.T) {
	for _, s := range Sizes() {
		lo, hi := sharedMinMBPerCPU, sharedMaxMBPerCPU
		if s.CPUCores > sharedMaxCPUs || s.MemoryMiB > s.CPUCores*sharedMaxMBPerCPU {
			lo, hi = perfMinMBPerCPU, perfMaxMBPerCPU
		}
		if s.MemoryMiB < lo*s.CPUCores || s.MemoryMiB > hi*s.CPUCores {
			t.Errorf("size %s: %d MB for %d vCPUs is outside Fly's range", s.Name, s.MemoryMiB, s.CPUCores)
		}
	}
}
