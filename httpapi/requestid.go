package httpapi

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"sync"

	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

// ClientRequestID returns the request's X-Request-Id as a response
// header's values, when the client sent a valid one; nil otherwise (a
// malformed client id is replaced, not refused: it is diagnostics only).
// The values are the request's own, capped to one so that an append
// copies them.
func ClientRequestID(h http.Header) []string {
	if v := h[protocol.HeaderRequestID]; len(v) > 0 && policy.ValidRequestID(v[0]) {
		return v[:1:1]
	}
	return nil
}

// RequestIDs makes request ids: "req_" and 24 hex digits. They are for
// diagnostics, not secrets: the runtime's generator (ChaCha8, seeded from
// the system's entropy) is enough, without a system call per request.
// The ids are made RequestIDBlock at a time, in one string and one slice
// of values, instead of two allocations per request. The zero value is
// ready; it is safe for concurrent use.
type RequestIDs struct {
	blocks sync.Pool // *idBlock
}

// RequestIDBlock is how many request ids RequestIDs makes at once.
const RequestIDBlock = 64

// idBlock are request ids made together; next is the first not given out.
type idBlock struct {
	vals []string
	next int
}

const requestIDLen = len("req_") + 24

// New returns a new request id as a response header's values, of
// capacity one: an append to them copies.
func (r *RequestIDs) New() []string {
	b, _ := r.blocks.Get().(*idBlock)
	if b == nil || b.next == RequestIDBlock {
		b = newIDBlock()
	}
	v := b.vals[b.next : b.next+1 : b.next+1]
	b.next++
	r.blocks.Put(b)
	return v
}

// NewID is New's id as a string.
func (r *RequestIDs) NewID() string { return r.New()[0] }

func newIDBlock() *idBlock {
	var buf [RequestIDBlock * requestIDLen]byte
	for i := range RequestIDBlock {
		putRequestID(buf[i*requestIDLen : (i+1)*requestIDLen])
	}
	ids := string(buf[:])
	b := &idBlock{vals: make([]string, RequestIDBlock)}
	for i := range b.vals {
		b.vals[i] = ids[i*requestIDLen : (i+1)*requestIDLen]
	}
	return b
}

// NewRequestID returns one new request id, for the rare answer that has
// no RequestIDs at hand (a raw connection's).
func NewRequestID() string {
	var id [requestIDLen]byte
	putRequestID(id[:])
	return string(id[:])
}

// putRequestID writes a new request id into id (requestIDLen bytes).
func putRequestID(id []byte) {
	var r [12]byte
	binary.LittleEndian.PutUint64(r[:8], rand.Uint64())
	binary.LittleEndian.PutUint32(r[8:], rand.Uint32())
	copy(id, "req_")
	hex.Encode(id[len("req_"):], r[:])
}
