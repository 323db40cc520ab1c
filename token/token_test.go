package token_test

import (
	"strings"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/token"
)

func TestNewValid(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		tok := token.New(token.Prefix).Reveal()
		if len(tok) != token.Len {
			t.Fatalf("len(New()) = %d; want %d", len(tok), token.Len)
		}
		if !token.Valid(tok, token.Prefix) {
			t.Fatalf("Valid(New()) = false")
		}
		if seen[tok] {
			t.Fatalf("New() repeated a token")
		}
		seen[tok] = true
	}
}

func TestValidRejects(t *testing.T) {
	good := token.New(token.Prefix).Reveal()
	flip := func(i int) string {
		b := []byte(good)
		if b[i] == 'a' {
			b[i] = 'b'
		} else {
			b[i] = 'a'
		}
		return string(b)
	}
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"wrong prefix", "xyz_" + good[4:]},
		{"body typo", flip(10)},
		{"checksum typo", flip(len(good) - 1)},
		{"short", good[:len(good)-1]},
		{"bad char", good[:10] + "!" + good[11:]},
		{"other prefix", strings.Replace(good, "sgt_", "sgo_", 1)},
	}
	for _, tt := range tests {
		if token.Valid(tt.in, token.Prefix) {
			t.Errorf("Valid(%s) = true; want false", tt.name)
		}
	}
}

func TestHashStable(t *testing.T) {
	tok := token.New(token.Prefix)
	if h1, h2 := token.Hash(tok), token.Hash(sandgate.Secret(tok.Reveal())); h1 != h2 || len(h1) != 64 {
		t.Fatalf("Hash = %q, %q; want one stable hex sha256", h1, h2)
	}
	if token.Hash(tok) == token.Hash(token.New(token.Prefix)) {
		t.Fatal("two tokens hash alike")
	}
	if strings.Contains(token.Hash(tok), tok.Reveal()) {
		t.Fatal("hash contains token")
	}
}

// TestSumIsHash: Hash is the hex of Sum (HashOf), the digest the gateway's
// auth cache is keyed by, whatever the token's length.
func TestSumIsHash(t *testing.T) {
	for _, tok := range []sandgate.Secret{token.New(token.Prefix), "", "short", sandgate.Secret(strings.Repeat("x", 3*token.Len))} {
		if got, want := token.HashOf(token.Sum(tok)), token.Hash(tok); got != want {
			t.Errorf("HashOf(Sum(%d bytes)) = %q; want Hash's %q", len(tok.Reveal()), got, want)
		}
	}
	if h := token.Hash("abc"); h != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf(`Hash("abc") = %q; want its SHA-256`, h)
	}
}
