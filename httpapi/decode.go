package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/sandgate/sandgate/protocol"
)

// Decode reads r's JSON body into v strictly: unknown fields (and a
// field name in another case), a null where a value belongs, trailing
// data and a body over the limit r.Body was bounded with
// (http.MaxBytesReader, limit bytes) are refused with invalid_request or
// payload_too_large (spec §Conventions). Its messages name a field at
// most, never encoding/json's own text.
func Decode(r *http.Request, v any, limit int64) error {
	body, err := readBody(r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return protocol.E(protocol.PayloadTooLarge, "request body is over "+strconv.FormatInt(limit>>20, 10)+" MiB")
		}
		return invalid("could not read the request body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return invalid("request body is required")
	}
	// encoding/json would replace invalid UTF-8, and a \u escape of a lone
	// surrogate, by U+FFFD: an argv or a path would silently change.
	if !ValidText(body) {
		return invalid("request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute):
			return invalid("field " + ute.Field + " has the wrong JSON type")
		case isUnknownField(err):
			// encoding/json names the field; field names are not content.
			return invalid("unknown request field " + unknownFieldName(err))
		}
		return invalid("request body is not valid JSON")
	}
	// encoding/json matches field names case-insensitively, and decodes a
	// null into a string as if it were absent; the spec wants a typo such as
	// "Label" and a null env value to fail loudly, so walk the tree too.
	// Most bodies hold nothing the walk could refuse (plainBody), and
	// skip it: only the rest are decoded a second time, into a tree.
	if t := reflect.TypeOf(v); !plainBody(body, t) {
		var tree any
		if err := json.Unmarshal(body, &tree); err == nil {
			if err := checkTree(tree, t, ""); err != nil {
				return err
			}
		}
	}
	if dec.More() {
		return invalid("request body has data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("request body has data after the JSON object")
	}
	return nil
}

// maxPrealloc bounds the buffer readBody sizes from Content-Length
// before any of the body has arrived.
const maxPrealloc = 64 << 10

// readBody reads r's whole body: into one buffer of its Content-Length
// when that is known and small, as io.ReadAll does otherwise (which
// starts small and grows, copying, as the body arrives).
func readBody(r *http.Request) ([]byte, error) {
	if r.ContentLength < 0 || r.ContentLength > maxPrealloc {
		return io.ReadAll(r.Body)
	}
	// bytes.MinRead more, so that the read that meets the end has room
	// without growing the buffer.
	buf := bytes.NewBuffer(make([]byte, 0, int(r.ContentLength)+bytes.MinRead))
	_, err := buf.ReadFrom(r.Body)
	return buf.Bytes(), err
}

// checkTree walks a decoded JSON tree beside the Go type it was decoded
// into. It refuses an object key that is not exactly a field's JSON name
// (maps, such as env, take any key); a null where a string, number or bool
// belongs (encoding/json would leave the zero value: an env value "", an
// argv element ""); and a null or "" for a field tagged wire:"nonempty", an
// optional field whose grammar needs at least one character when it is sent.
// field is the JSON name of the field tree was found in, "" at the top.
func checkTree(tree any, t reflect.Type, field string) error {
	if tree == nil && t.Kind() == reflect.Pointer {
		return nil // a pointer field: null is absent, as for egress
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch node := tree.(type) {
	case nil:
		if isScalar(t.Kind()) {
			return invalid(NullMessage(field))
		}
	case map[string]any:
		switch t.Kind() {
		case reflect.Map:
			for _, sub := range node {
				if sub == nil && isScalar(t.Elem().Kind()) {
					return invalid(field + " has a null value; its values must be strings")
				}
			}
		case reflect.Struct:
			return checkObject(node, t)
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return nil
		}
		for _, sub := range node {
			if sub == nil && isScalar(t.Elem().Kind()) {
				return invalid(field + " has a null element; its elements must be strings")
			}
			if err := checkTree(sub, t.Elem(), field); err != nil {
				return err
			}
		}
	}
	return nil
}

// plainBody reports whether checkTree cannot refuse body, decoded as
// it was into a value of type t, found by one pass over its bytes: no
// null and no empty string anywhere, and every object key one of the
// exact JSON names of the fields of t's structs (wireNames), written
// without escapes. Decoded with DisallowUnknownFields, such a key is
// exactly the name of the field it went to unless two of those names
// differ only in case, and wireNames refuses such a t. It never answers
// true for a body checkTree would refuse; a false only costs the walk.
func plainBody(body []byte, t reflect.Type) bool {
	names, ok := wireNames(t)
	if !ok {
		return false
	}
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case 'n': // outside a string, only null starts with it
			return false
		case '"':
			start, escaped := i+1, false
			for i++; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					escaped = true
					i++
				}
			}
			if i >= len(body) || i == start {
				return false // unterminated (the decoder refused it), or ""
			}
			j := i + 1
			for j < len(body) && (body[j] == ' ' || body[j] == '\t' || body[j] == '\n' || body[j] == '\r') {
				j++
			}
			if j < len(body) && body[j] == ':' {
				if _, ok := names[string(body[start:i])]; escaped || !ok {
					return false
				}
			}
		}
	}
	return true
}

// wireNameSets caches wireNames by type.
var wireNameSets sync.Map // reflect.Type → map[string]struct{} (nil: no fast path)

// wireNames returns the exact JSON names of the fields of every struct
// type t holds (through pointers, slices and maps), and false when two of
// them are equal but for case: then a key that one names may have been
// decoded into the other's field, which only checkTree tells apart.
func wireNames(t reflect.Type) (map[string]struct{}, bool) {
	if m, ok := wireNameSets.Load(t); ok {
		names := m.(map[string]struct{})
		return names, names != nil
	}
	names := map[string]struct{}{}
	folded := map[string]string{}
	seen := map[reflect.Type]bool{}
	ok := true
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			if t.Field(i).Anonymous {
				ok = false // encoding/json promotes its fields; fieldsOf does not
			}
		}
		for name, f := range fieldsOf(t) {
			low := strings.ToLower(name)
			if other, dup := folded[low]; (dup && other != name) || !isASCII(name) {
				ok = false
			}
			folded[low], names[name] = name, struct{}{}
			walk(f.t)
		}
	}
	walk(t)
	if !ok {
		names = nil
	}
	m, _ := wireNameSets.LoadOrStore(t, names)
	names = m.(map[string]struct{})
	return names, names != nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// wireField is a struct field as checkObject sees it: its Go type, and
// whether it is tagged wire:"nonempty".
type wireField struct {
	t        reflect.Type
	nonEmpty bool
}

// wireFields maps a request struct type to its fields by exact JSON name.
// A type's fields never change, so each is built once (as encoding/json
// caches its own), not per request.
var wireFields sync.Map // reflect.Type → map[string]wireField

// fieldsOf returns the fields of the struct type t by exact JSON name.
func fieldsOf(t reflect.Type) map[string]wireField {
	if m, ok := wireFields.Load(t); ok {
		return m.(map[string]wireField)
	}
	fields := make(map[string]wireField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name != "-" {
			fields[name] = wireField{f.Type, f.Tag.Get("wire") == "nonempty"}
		}
	}
	m, _ := wireFields.LoadOrStore(t, fields)
	return m.(map[string]wireField)
}

// checkObject is checkTree for a JSON object decoded into the struct type t.
func checkObject(node map[string]any, t reflect.Type) error {
	fields := fieldsOf(t)
	keys := make([]string, 0, len(node))
	for k := range node {
		keys = append(keys, k)
	}
	if len(keys) > 1 {
		slices.Sort(keys)
	}
	for _, k := range keys {
		f, ok := fields[k]
		if !ok {
			if len(k) > 64 {
				k = k[:64]
			}
			return invalid("unknown request field " + k)
		}
		sub := node[k]
		if f.nonEmpty && (sub == nil || sub == "") {
			// The name is the struct's, never the client's.
			return invalid("field " + k + " must not be empty or null; omit it instead")
		}
		if err := checkTree(sub, f.t, k); err != nil {
			return err
		}
	}
	return nil
}

// isScalar reports whether k is a kind JSON null cannot stand for.
func isScalar(k reflect.Kind) bool {
	switch k {
	case reflect.String, reflect.Bool, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// NullMessage is the refusal's message for a null in field ("" for the
// whole body).
func NullMessage(field string) string {
	if field == "" {
		return "request body must be a JSON object, not null"
	}
	return "field " + field + " must not be null; omit it instead"
}

// ValidText reports whether body is valid UTF-8 whose JSON strings escape
// no lone surrogate (\ud800 to \udfff outside a high-low pair), which
// encoding/json would also turn into U+FFFD.
func ValidText(body []byte) bool {
	if !utf8.Valid(body) {
		return false
	}
	inString := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\' && i+1 < len(body):
			i++
			if body[i] != 'u' {
				continue
			}
			r, ok := Hex4(body, i+1)
			if !ok {
				continue // malformed; the decoder refuses it
			}
			i += 4
			switch {
			case 0xDC00 <= r && r <= 0xDFFF:
				return false // a low surrogate with no high one before it
			case 0xD800 <= r && r <= 0xDBFF:
				if i+2 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' {
					return false
				}
				lo, ok := Hex4(body, i+3)
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false
				}
				i += 6
			}
		}
	}
	return true
}

// Hex4 parses the four hexadecimal digits of a \u escape at body[i:].
func Hex4(body []byte, i int) (rune, bool) {
	if i+4 > len(body) {
		return 0, false
	}
	var r rune
	for _, c := range body[i : i+4] {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

const unknownFieldPrefix = "json: unknown field "

func isUnknownField(err error) bool {
	return len(err.Error()) > len(unknownFieldPrefix) && err.Error()[:len(unknownFieldPrefix)] == unknownFieldPrefix
}

func unknownFieldName(err error) string {
	name := err.Error()[len(unknownFieldPrefix):]
	if len(name) > 66 {
		name = name[:66]
	}
	return name
}

// invalid is a 400 invalid_request with a message for the client.
func invalid(msg string) error { return protocol.E(protocol.InvalidRequest, msg) }
