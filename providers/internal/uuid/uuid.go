// Package uuid spells the UUIDs vendor APIs ask for (idempotency keys,
// exec ids), for the providers and their fakes.
package uuid

import (
	"crypto/rand"
	"encoding/hex"
)

// New returns a random UUID (version 4).
func New() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return Format(b)
}

// Format spells b as a UUID: 8-4-4-4-12 lowercase hex digits. It sets no
// version bits: the caller has.
func Format(b [16]byte) string {
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
