package residentd

import (
	"reflect"
	"strings"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	for _, r := range []Request{
		{Argv: []string{"echo", "ready"}, Env: []string{"PATH=/bin", "X="}, Dir: "/workspace", Join: 2, Leave: 2, Home: true},
		{Argv: []string{"sh", "-c", "cat"}, Env: []string{}, Dir: "/", Stdin: true, Join: 4, Leave: 2, Data: 1 << 40},
		{Argv: []string{strings.Repeat("é", 70000)}, Env: []string{"BIG=" + strings.Repeat("x", 1<<20)}, Dir: ""},
	} {
		got, err := ParseRequest(r.Append(nil))
		if err != nil {
			t.Fatalf("ParseRequest: %v", err)
		}
		if len(r.Env) == 0 {
			r.Env = []string{} // decoded as empty, not nil
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip of %+.80v gave %+.80v", r, got)
		}
	}
	for _, r := range []Reply{{Status: 256}, {Err: "No such file or directory", Chdir: true}, {Cgroup: true}, {Status: -1}} {
		got, err := ParseReply(r.Append(nil))
		if err != nil || got != r {
			t.Errorf("round trip of %+v gave %+v, %v", r, got, err)
		}
	}
}

// A message cut short, one with bytes past its end, and one whose counts
// do not fit are refused, never read past their end.
func TestWireMalformed(t *testing.T) {
	good := Request{Argv: []string{"true"}, Env: []string{"A=b"}, Dir: "/w", Join: 1}.Append(nil)
	for i := range len(good) {
		if _, err := ParseRequest(good[:i]); err == nil {
			t.Errorf("a request cut to %d of %d bytes parsed", i, len(good))
		}
	}
	if _, err := ParseRequest(append(good, 0)); err == nil {
		t.Errorf("a request with a byte past its end parsed")
	}
	for _, b := range [][]byte{
		{0, MaxFDs + 1, 0, 0, 0, 0, 0},                                     // too many descriptors to join
		{0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0},                   // a count past the message
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // a varint too long
	} {
		if _, err := ParseRequest(b); err == nil {
			t.Errorf("%x parsed", b)
		}
	}
}
