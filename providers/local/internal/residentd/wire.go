package residentd

import "errors"

// The messages between the broker and the resident are varints and
// length-prefixed strings, in the order of their types' fields, rather
// than JSON: encoding/json is initialised late in the broker's binary,
// and every resident's start would wait for it (see the package doc).

// Append appends r's encoding to b.
func (r Request) Append(b []byte) []byte {
	b = appendUint(b, uint64(btoi(r.Stdin)))
	b = appendUint(b, uint64(r.Join))
	b = appendUint(b, uint64(r.Leave))
	b = appendUint(b, uint64(btoi(r.Home)))
	b = appendUint(b, r.Data)
	b = appendString(b, r.Dir)
	b = appendStrings(b, r.Argv)
	return appendStrings(b, r.Env)
}

// ParseRequest decodes a Request that Append encoded.
func ParseRequest(b []byte) (Request, error) {
	d := decoder{b: b}
	r := Request{Stdin: d.uint() == 1, Join: d.fds(), Leave: d.fds(), Home: d.uint() == 1, Data: d.uint(), Dir: d.string()}
	r.Argv = d.strings()
	r.Env = d.strings()
	return r, d.end()
}

// Append appends r's encoding to b.
func (r Reply) Append(b []byte) []byte {
	b = appendUint(b, uint64(uint32(r.Status)))
	b = appendString(b, r.Err)
	b = appendUint(b, uint64(btoi(r.Chdir)))
	return appendUint(b, uint64(btoi(r.Cgroup)))
}

// ParseReply decodes a Reply that Append encoded.
func ParseReply(b []byte) (Reply, error) {
	d := decoder{b: b}
	r := Reply{Status: int(int32(uint32(d.uint()))), Err: d.string(), Chdir: d.uint() == 1, Cgroup: d.uint() == 1}
	return r, d.end()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func appendUint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendString(b []byte, s string) []byte {
	return append(appendUint(b, uint64(len(s))), s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = appendUint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

var errMessage = errors.New("residentd: malformed message")

// decoder reads what the append functions wrote; its first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uint() uint64 {
	var v uint64
	for i := 0; i < 10; i++ {
		if d.err != nil || len(d.b) == 0 {
			d.err = errMessage
			return 0
		}
		c := d.b[0]
		d.b = d.b[1:]
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v
		}
	}
	d.err = errMessage
	return 0
}

// fds reads a count of descriptors, at most MaxFDs.
func (d *decoder) fds() int {
	v := d.uint()
	if v > MaxFDs {
		d.err = errMessage
		return 0
	}
	return int(v)
}

func (d *decoder) string() string {
	n := d.uint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errMessage
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) strings() []string {
	n := d.uint()
	if d.err != nil || n > uint64(len(d.b)) { // each string takes a byte at least
		d.err = errMessage
		return nil
	}
	ss := make([]string, 0, n)
	for range n {
		ss = append(ss, d.string())
	}
	return ss
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = errMessage
	}
	return d.err
}
