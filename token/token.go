// Package token mints and checks sandgate bearer tokens.
//
// A token is "sgt_" followed by 43 base62 characters of randomness (256
// bits) and a 6-character base62 CRC-32 of everything before it, as GitHub's
// tokens do: a secret scanner recognizes the prefix and verifies the
// checksum offline, without asking the broker. Only the SHA-256 of a token
// is stored.
package token

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"hash/crc32"
	"strings"

	"github.com/sandgate/sandgate"
)

// Prefix starts every client token.
const Prefix = "sgt_"

const (
	alphabet    = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	bodyLen     = 43 // ceil(256 / log2(62))
	checksumLen = 6  // 62^6 > 2^32
	// Len is the length of every token.
	Len = len(Prefix) + bodyLen + checksumLen
)

// New mints a fresh token with the given prefix (Prefix for client tokens).
func New(prefix string) sandgate.Secret {
	var b strings.Builder
	b.Grow(len(prefix) + bodyLen + checksumLen)
	b.WriteString(prefix)
	// Rejection sampling keeps every character uniform over the alphabet.
	buf := make([]byte, 64)
	for n := 0; n < bodyLen; {
		rand.Read(buf) // never fails (crypto/rand: Read panics rather than return an error)
		for _, c := range buf {
			if c >= 248 { // 248 = 4*62: keep only bytes that map uniformly
				continue
			}
			b.WriteByte(alphabet[int(c)%62])
			n++
			if n == bodyLen {
				break
			}
		}
	}
	b.WriteString(checksum(b.String()))
	return sandgate.Secret(b.String())
}

func checksum(s string) string {
	v := crc32.ChecksumIEEE([]byte(s))
	out := make([]byte, checksumLen)
	for i := checksumLen - 1; i >= 0; i-- {
		out[i] = alphabet[v%62]
		v /= 62
	}
	return string(out)
}

// Valid reports whether s has the shape of a token minted with prefix and a
// correct checksum. It says nothing about whether the broker knows it.
func Valid(s, prefix string) bool {
	if len(s) != len(prefix)+bodyLen+checksumLen || !strings.HasPrefix(s, prefix) {
		return false
	}
	for i := len(prefix); i < len(s); i++ {
		if strings.IndexByte(alphabet, s[i]) < 0 {
			return false
		}
	}
	body := s[:len(s)-checksumLen]
	return checksum(body) == s[len(s)-checksumLen:]
}

// Hash returns the hex SHA-256 of a token: the only form the broker stores.
func Hash(s sandgate.Secret) string {
	var hexed [HashLen]byte
	return string(HashInto(&hexed, s))
}

// HashLen is the length of Hash's answer.
const HashLen = 2 * sha256.Size

// HashInto writes Hash's answer into dst, for a caller that looks it up
// without allocating a string, and returns dst's slice.
func HashInto(dst *[HashLen]byte, s sandgate.Secret) []byte {
	sum := Sum(s)
	hex.Encode(dst[:], sum[:])
	return dst[:]
}

// Sum returns the SHA-256 of a token: Hash's answer before its hex
// (HashOf), for a caller that keys a lookup by the digest itself.
func Sum(s sandgate.Secret) [sha256.Size]byte {
	var raw [Len]byte // no copy on the heap for a token of the usual length
	return sha256.Sum256(append(raw[:0], s.Reveal()...))
}

// HashOf returns Hash's answer of the token whose Sum is sum.
func HashOf(sum [sha256.Size]byte) string {
	return hex.EncodeToString(sum[:])
}

// DisplayPrefix returns the first characters of a token, enough for an
// operator to tell tokens apart and too few to use.
func DisplayPrefix(s sandgate.Secret) string {
	r := s.Reveal()
	if len(r) > 12 {
		return r[:12]
	}
	return ""
}
