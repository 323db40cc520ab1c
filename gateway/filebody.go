package gateway

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

// writeBody scans the body of POST …/files/write as a stream, so that
// neither the body, nor its base64 text, nor the decoded contents are ever
// held whole by the gateway: the decoded bytes of contents_b64 reach the
// provider through Read as the body arrives.
//
// It refuses what decode refuses, with the same codes and messages: a
// body over 12 MiB (413 payload_too_large, measured on the body as sent,
// by the MaxBytesReader of every request), text that is not UTF-8, JSON
// that is not valid, an unknown field, a field of the wrong type or null,
// data after the object, a bad path, contents that are not standard base64
// with padding, and contents that decode to more than max_file_bytes
// (413 file_too_large, counted on the decoded bytes, of which no more than
// max_file_bytes are ever passed on). Where a body has several faults, the
// one decode would have answered wins: after a fault found inside the
// contents, the rest of the body is still scanned, and after a fault the
// scan cannot go past, the rest is read (and dropped) to tell a body over
// the limit. A field named twice is refused (encoding/json would keep the
// last).
//
// Read yields io.EOF only once the whole body has been scanned and found
// good, and the scan's error otherwise: a provider that reads it to its
// end before replacing the file (the Provider contract) never writes
// contents from a refused request.
type writeBody struct {
	br   *bufio.Reader
	max  int64 // max_file_bytes
	hint int64 // an upper bound of the decoded size

	path                   string
	seenPath, seenContents bool

	state scanState
	err   error // the fault to answer, once one is found
	rank  int   // err's precedence: lower wins

	// The base64 decoder: text holds characters not yet decoded, dec the
	// decoded bytes not yet read (stream) or kept (held).
	text   []byte
	dec    []byte
	out    []byte
	padded bool  // the last block decoded ended in padding: nothing may follow
	n      int64 // decoded bytes so far
	held   *fileBuf
}

type scanState int

const (
	scanMembers  scanState = iota // in the object, before a member
	scanContents                  // inside the contents string, streaming
	scanDone                      // the body is read to its end (or past use)
)

// Fault precedence, in the order decode finds them.
const (
	rankRead      = iota + 1 // the body could not be read
	rankBody                 // over 12 MiB
	rankText                 // not UTF-8
	rankSyntax               // not valid JSON
	rankField                // unknown field, wrong type, null
	rankTrailing             // data after the object
	rankPath                 // policy.ValidatePath
	rankLineBreak            // contents with a line break
	rankBase64               // contents not base64
	rankSize                 // contents over max_file_bytes
)

const (
	textSize = 16 << 10 // base64 characters decoded at once (a multiple of 4)
	// writeBodyBuffers is what a write holds besides the contents: the
	// body's read buffer and the decoder's.
	writeBodyBuffers = 32<<10 + textSize + textSize/4*3
	maxKeyBytes      = 256     // a longer key is no field's
	maxPathRawBytes  = 6 << 12 // a path's JSON text: each byte of 4096 at most a 6-byte \u escape
)

var (
	errBodyNotJSON  = errInvalid("request body is not valid JSON")
	errBodyNotText  = errInvalid("request body is not valid UTF-8")
	errBodyTrailing = errInvalid("request body has data after the JSON object")
	errContentsB64  = errInvalid("contents_b64 is not standard base64 with padding")
	errContentsLF   = errInvalid("contents_b64 is not standard base64 with padding: it contains a line break")
	errContentsSize = protocol.E(protocol.FileTooLarge, "contents are over max_file_bytes")
	errBodyTooLarge = protocol.E(protocol.PayloadTooLarge, "request body is over 12 MiB")
)

// newWriteBody scans body (already under the request's MaxBytesReader)
// whose declared length is contentLength (-1 when unknown).
func newWriteBody(body io.Reader, contentLength, maxFileBytes int64) *writeBody {
	return &writeBody{br: bufio.NewReaderSize(body, 32<<10), max: maxFileBytes,
		hint: decodedBound(contentLength, maxFileBytes)}
}

// decodedBound is the most contents a body of that declared length (-1:
// unknown) may decode to under max_file_bytes.
func decodedBound(contentLength, maxFileBytes int64) int64 {
	bound := int64(protocol.MaxBodyBytes)
	if contentLength >= 0 && contentLength < bound {
		bound = contentLength
	}
	return min(max(maxFileBytes, 0), bound/4*3+3)
}

// writeCost is what a write of that declared length holds at most in the
// gateway and the provider together, when the path comes first: the
// decoded contents once (the provider's copy) and the scan's buffers.
func writeCost(contentLength, maxFileBytes int64) int64 {
	return decodedBound(contentLength, maxFileBytes) + writeBodyBuffers
}

// fail records a fault; the one of lowest rank, then the first, wins.
func (b *writeBody) fail(rank int, err error) {
	if b.err == nil || rank < b.rank {
		b.err, b.rank = err, rank
	}
}

// fatal records a fault the scan cannot go past, and reads the rest of
// the body to tell one over the limit.
func (b *writeBody) fatal(rank int, err error) {
	b.fail(rank, err)
	b.state = scanDone
	if _, err := io.Copy(io.Discard, b.br); err != nil {
		b.readFailed(err)
	}
}

// readFailed records a failure to read the body: over the limit, cut
// short, or broken.
func (b *writeBody) readFailed(err error) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		b.fail(rankBody, errBodyTooLarge)
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		b.fail(rankSyntax, errBodyNotJSON)
	default:
		b.fail(rankRead, errInvalid("could not read the request body"))
	}
	b.state = scanDone
}

// readByte reads one byte; false once the scan is done (the error recorded).
func (b *writeBody) readByte() (byte, bool) {
	c, err := b.br.ReadByte()
	if err != nil {
		b.readFailed(err)
		return 0, false
	}
	return c, true
}

// nextByte skips whitespace and reads the byte after it. At the end of
// the body it returns false with eof set and nothing recorded.
func (b *writeBody) nextByte() (c byte, ok, eof bool) {
	for {
		c, err := b.br.ReadByte()
		if err == io.EOF {
			return 0, false, true
		}
		if err != nil {
			b.readFailed(err)
			return 0, false, false
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c, true, false
	}
}

// head scans the body up to the start of the contents when the path came
// before them (stream is then true, and Read yields the contents), or to
// its end, holding the decoded contents in the gateway when they came
// first. Faults are in b.err.
func (b *writeBody) head() (stream bool) {
	c, ok, eof := b.nextByte()
	switch {
	case eof:
		b.fail(rankSyntax, errInvalid("request body is required"))
		b.state = scanDone
		return false
	case !ok:
		return false
	case c == 'n':
		// encoding/json takes a null body as an empty object.
		if b.literal("ull") {
			b.end()
			b.noPath()
		}
		return false
	case c != '{':
		if isValueStart(c) {
			b.fatal(rankField, errInvalid("request body must be a JSON object"))
		} else {
			b.fatal(rankSyntax, errBodyNotJSON)
		}
		return false
	}
	b.members(true, true)
	b.noPath()
	return b.state == scanContents
}

// noPath refuses a body read to its end without a path, as
// policy.ValidatePath refuses "".
func (b *writeBody) noPath() {
	if b.state == scanDone && !b.seenPath {
		if err := policy.ValidatePath(""); err != nil {
			b.fail(rankPath, err)
		}
	}
}

// next is nextByte for where the body may not end yet.
func (b *writeBody) next() (byte, bool) {
	c, ok, eof := b.nextByte()
	if eof {
		b.fail(rankSyntax, errBodyNotJSON)
		b.state = scanDone
	}
	return c, ok
}

// members scans the object's members (first: none was read yet). In
// stream mode it stops at the start of the contents string when the path
// is known and no fault is.
func (b *writeBody) members(first, stream bool) {
	for b.state == scanMembers {
		c, ok := b.next()
		if !ok {
			return
		}
		switch {
		case c == '}':
			b.end()
			return
		case !first && c == ',':
			if c, ok = b.next(); !ok {
				return
			}
		case !first:
			b.fatal(rankSyntax, errBodyNotJSON)
			return
		}
		first = false
		if c != '"' {
			b.fatal(rankSyntax, errBodyNotJSON)
			return
		}
		key, ok := b.str(maxKeyBytes)
		if !ok {
			return
		}
		if c, ok := b.next(); !ok {
			return
		} else if c != ':' {
			b.fatal(rankSyntax, errBodyNotJSON)
			return
		}
		switch key {
		case "path":
			if !b.pathValue() {
				return
			}
		case "contents_b64":
			if b.seenContents {
				b.fatal(rankField, errInvalid("field contents_b64 is given twice"))
				return
			}
			b.seenContents = true
			if !b.stringStart("contents_b64") {
				return
			}
			if stream && b.seenPath && b.err == nil {
				b.state = scanContents
				return
			}
			if !b.seenPath && b.err == nil {
				b.held = &fileBuf{}
			}
			b.contentsTo(b.held) // with a fault known, scan on and decode nothing
		default:
			b.fatal(rankField, errInvalid("unknown request field "+unknownKey(key)))
			return
		}
	}
}

// unknownKey names an unknown key as decode did: as encoding/json quotes
// it, or bare for a key that differs from a field's name only in case
// (which encoding/json takes, and the strict check then refuses).
func unknownKey(key string) string {
	if strings.EqualFold(key, "path") || strings.EqualFold(key, "contents_b64") {
		if len(key) > 64 {
			key = key[:64]
		}
		return key
	}
	q := strconv.Quote(key)
	if len(q) > 66 {
		q = q[:66]
	}
	return q
}

// end checks that nothing but whitespace follows the object.
func (b *writeBody) end() {
	_, ok, eof := b.nextByte()
	switch {
	case eof:
		b.state = scanDone
	case ok:
		b.fatal(rankTrailing, errBodyTrailing)
	}
}

// pathValue reads the path's value.
func (b *writeBody) pathValue() bool {
	if b.seenPath {
		b.fatal(rankField, errInvalid("field path is given twice"))
		return false
	}
	b.seenPath = true
	if !b.stringStart("path") {
		return false
	}
	p, ok := b.str(maxPathRawBytes)
	if !ok {
		return false
	}
	b.path = p
	if err := policy.ValidatePath(p); err != nil {
		b.fail(rankPath, err)
	}
	return true
}

// stringStart reads the first byte of field's value, which must open a
// string; a null or another type is refused.
func (b *writeBody) stringStart(field string) bool {
	c, ok := b.next()
	switch {
	case !ok:
		return false
	case c == '"':
		return true
	case c == 'n':
		if b.literal("ull") {
			b.fatal(rankField, errInvalid(httpapi.NullMessage(field)))
		}
		return false
	case isValueStart(c):
		b.fatal(rankField, errInvalid("field "+field+" has the wrong JSON type"))
		return false
	}
	b.fatal(rankSyntax, errBodyNotJSON)
	return false
}

// literal reads the rest of a JSON literal; false (a syntax fault) when
// the body holds something else.
func (b *writeBody) literal(rest string) bool {
	for i := 0; i < len(rest); i++ {
		c, ok := b.readByte()
		if !ok {
			return false
		}
		if c != rest[i] {
			b.fatal(rankSyntax, errBodyNotJSON)
			return false
		}
	}
	return true
}

func isValueStart(c byte) bool {
	return c == '{' || c == '[' || c == '"' || c == '-' || c == 't' || c == 'f' || ('0' <= c && c <= '9')
}

// str reads a JSON string whose opening quote was read and decodes it
// as decode would (refusing invalid UTF-8 and lone surrogates). A string
// whose JSON text is over limit bytes is read to its end and returned
// as a string longer than any key or path.
func (b *writeBody) str(limit int) (string, bool) {
	raw := []byte{'"'}
	over := false
	for {
		c, ok := b.readByte()
		if !ok {
			return "", false
		}
		if len(raw) < limit {
			raw = append(raw, c)
		} else {
			over = true
		}
		if c == '\\' {
			c, ok = b.readByte()
			if !ok {
				return "", false
			}
			if len(raw) < limit {
				raw = append(raw, c)
			}
			continue
		}
		if c == '"' {
			break
		}
		if c < 0x20 {
			b.fatal(rankSyntax, errBodyNotJSON)
			return "", false
		}
	}
	if over {
		return strings.Repeat("p", policy.MaxPathBytes+1), true
	}
	if !httpapi.ValidText(raw) {
		b.fatal(rankText, errBodyNotText)
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		b.fatal(rankSyntax, errBodyNotJSON)
		return "", false
	}
	return s, true
}

// contentsTo scans the rest of the contents string, decoding it into to
// (or dropping it when to is nil or a fault is known), then the rest of
// the object.
func (b *writeBody) contentsTo(to *fileBuf) {
	for b.state != scanDone {
		ended := b.run()
		if b.err == nil && to != nil && len(b.out) > 0 {
			to.Write(b.out)
		}
		b.out = nil
		if ended {
			break
		}
	}
}

// run scans the next run of the contents string, decoding what it can
// into b.out; true once the closing quote is read (the final block
// decoded).
func (b *writeBody) run() bool {
	if _, err := b.br.Peek(1); err != nil {
		b.readFailed(err)
		return false
	}
	buf, _ := b.br.Peek(b.br.Buffered())
	if b.err == nil && len(buf) > textSize-len(b.text) {
		buf = buf[:textSize-len(b.text)] // one block at most: Read passes it on first
	}
	i := 0
	for i < len(buf) {
		c := buf[i]
		if c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
			break
		}
		i++
	}
	if i > 0 {
		b.feed(buf[:i])
		b.br.Discard(i)
		return false
	}
	switch c := buf[0]; {
	case c == '"':
		b.br.Discard(1)
		b.flush(true)
		return true
	case c == '\\':
		b.br.Discard(1)
		b.escape()
	case c < 0x20:
		b.fatal(rankSyntax, errBodyNotJSON)
	default:
		head, _ := b.br.Peek(min(4, b.br.Buffered()))
		if !utf8.FullRune(head) {
			head, _ = b.br.Peek(4) // the rune's end is not buffered yet
		}
		r, size := utf8.DecodeRune(head)
		if r == utf8.RuneError && size <= 1 {
			b.fatal(rankText, errBodyNotText)
			return false
		}
		b.br.Discard(size)
		b.fail(rankBase64, errContentsB64)
	}
	return false
}

// escape reads an escape of the contents string (after its backslash):
// the one that stands for a base64 character ("\/", "\u0041") is one.
func (b *writeBody) escape() {
	c, ok := b.readByte()
	if !ok {
		return
	}
	var r rune
	switch c {
	case '/':
		r = '/'
	case '"', '\\', 'b', 'f', 't':
		r = 0 // never base64
	case 'n', 'r':
		b.fail(rankLineBreak, errContentsLF)
		return
	case 'u':
		var hex [6]byte
		hex[0], hex[1] = '\\', 'u'
		for i := 2; i < 6; i++ {
			if hex[i], ok = b.readByte(); !ok {
				return
			}
		}
		v, ok := httpapi.Hex4(hex[:], 2)
		if !ok {
			b.fatal(rankSyntax, errBodyNotJSON)
			return
		}
		switch {
		case 0xDC00 <= v && v <= 0xDFFF:
			b.fatal(rankText, errBodyNotText)
			return
		case 0xD800 <= v && v <= 0xDBFF:
			var lo [6]byte
			for i := range lo {
				if lo[i], ok = b.readByte(); !ok {
					return
				}
			}
			if w, ok := httpapi.Hex4(lo[:], 2); lo[0] != '\\' || lo[1] != 'u' || !ok || w < 0xDC00 || w > 0xDFFF {
				b.fatal(rankText, errBodyNotText)
				return
			}
			r = 0 // a pair: never base64
		case v == '\n' || v == '\r':
			b.fail(rankLineBreak, errContentsLF)
			return
		default:
			r = v
		}
	default:
		b.fatal(rankSyntax, errBodyNotJSON)
		return
	}
	if r > 0 && r < 0x80 {
		b.feed([]byte{byte(r)})
	} else {
		b.fail(rankBase64, errContentsB64)
	}
}

// feed adds base64 characters (at most what the block has room for),
// decoding the block once it is full.
func (b *writeBody) feed(p []byte) {
	if b.err != nil {
		return // a fault is known: nothing more is decoded
	}
	if b.text == nil {
		b.text = make([]byte, 0, textSize)
	}
	b.text = append(b.text, p...)
	if len(b.text) >= textSize {
		b.flush(false)
	}
}

// flush decodes the characters held; final is the end of the string.
// Padding may end only the last block.
func (b *writeBody) flush(final bool) {
	if b.err != nil {
		b.text = b.text[:0]
		return
	}
	if len(b.text) == 0 {
		return
	}
	if b.padded {
		b.fail(rankBase64, errContentsB64)
		return
	}
	if b.dec == nil {
		b.dec = make([]byte, textSize/4*3)
	}
	n, err := base64.StdEncoding.Strict().Decode(b.dec, b.text)
	b.padded = b.text[len(b.text)-1] == '='
	b.text = b.text[:0]
	if err != nil {
		b.fail(rankBase64, errContentsB64)
		return
	}
	b.n += int64(n)
	if b.n > b.max {
		b.fail(rankSize, errContentsSize)
		return
	}
	b.out = b.dec[:n]
}

// Read yields the decoded contents while the body is scanned; io.EOF once
// the whole body is found good, the fault otherwise.
func (b *writeBody) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		switch b.state {
		case scanDone:
			if b.err != nil {
				return 0, b.err
			}
			return 0, io.EOF
		case scanContents:
			if b.run() && b.state == scanContents {
				b.state = scanMembers
			}
			if b.err != nil {
				b.out = nil
			}
		case scanMembers:
			b.members(false, false)
		}
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

// SizeHint is an upper bound of what Read yields (providers.ReadContent).
func (b *writeBody) SizeHint() int64 { return b.hint }

// finish scans what is left of the body (after a provider that stopped
// reading early) and returns the fault, if any.
func (b *writeBody) finish() error {
	for b.state != scanDone {
		if _, err := b.Read(make([]byte, 4096)); err != nil {
			break
		}
	}
	return b.err
}

// fileBuf holds contents in chunks allocated for it alone (not pooled: a
// burst of large transfers must not leave its memory in a pool).
type fileBuf struct {
	chunks [][]byte
	n      int64
	off    int64 // read position
}

const fileChunk = 256 << 10

// Write implements io.Writer; it never fails.
func (f *fileBuf) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if len(f.chunks) == 0 || len(f.chunks[len(f.chunks)-1]) == fileChunk {
			f.chunks = append(f.chunks, make([]byte, 0, fileChunk))
		}
		last := &f.chunks[len(f.chunks)-1]
		n := min(len(p), fileChunk-len(*last))
		*last = append(*last, p[:n]...)
		p = p[n:]
		f.n += int64(n)
	}
	return total, nil
}

// Read implements io.Reader over what was written.
func (f *fileBuf) Read(p []byte) (int, error) {
	if f.off >= f.n {
		return 0, io.EOF
	}
	c := f.chunks[f.off/fileChunk][f.off%fileChunk:]
	n := copy(p, c)
	f.off += int64(n)
	return n, nil
}

// SizeHint is the size held (providers.ReadContent).
func (f *fileBuf) SizeHint() int64 { return f.n - f.off }
