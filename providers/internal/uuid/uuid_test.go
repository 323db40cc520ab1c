package uuid_test

import (
	"regexp"
	"testing"

	"github.com/sandgate/sandgate/providers/internal/uuid"
)

func TestNew(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := uuid.New(), uuid.New()
	if !re.MatchString(a) {
		t.Errorf("New() = %q; want a version 4 UUID", a)
	}
	if a == b {
		t.Errorf("New() twice = %q; want two UUIDs", a)
	}
}

func TestFormat(t *testing.T) {
	b := [16]byte{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	if got, want := uuid.Format(b), "00112233-4455-6677-8899-aabbccddeeff"; got != want {
		t.Errorf("Format(%x) = %q; want %q", b, got, want)
	}
}
