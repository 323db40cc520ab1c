// Package openapitest checks requests and answers against the schemas of
// the documents in package openapi, for tests: the broker serves the
// documents but does not validate against them, so it does not link the
// JSON Schema compiler, whose package init would cost every start of the
// binary (a CLI command, the broker, a durable command's step helper)
// several milliseconds of CPU.
package openapitest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sandgate/sandgate/openapi"
)

// Spec is a loaded document that checks requests and answers against its
// schemas, JSON Schema 2020-12 with format date-time asserted.
type Spec struct {
	name string
	doc  struct {
		Paths      map[string]map[string]*Operation `json:"paths"`
		Components struct {
			Responses map[string]*Response `json:"responses"`
		} `json:"components"`
	}
	// schemas holds every body schema of the document compiled, by its
	// text: CheckJSON is handed the text, and equal texts in one document
	// mean the same schema because their $refs are all to the document.
	schemas map[string]*jsonschema.Schema
}

// Operation is one operation of a document.
type Operation struct {
	ID          string               `json:"operationId"`
	RequestBody *Body                `json:"requestBody"`
	Responses   map[string]*Response `json:"responses"`
}

// Body is a request body.
type Body struct {
	Required bool                  `json:"required"`
	Content  map[string]*MediaType `json:"content"`
}

// Response is one documented answer; Ref is set when it names a shared
// one under components.responses.
type Response struct {
	Ref     string                `json:"$ref"`
	Content map[string]*MediaType `json:"content"`
}

// MediaType is a body's schema and its example.
type MediaType struct {
	Schema  json.RawMessage `json:"schema"`
	Example json.RawMessage `json:"example"`
}

// Load reads the embedded document name (openapi.V1 or openapi.Admin) and compiles the
// schema of every request and answer body it documents.
func Load(name string) (*Spec, error) {
	b, err := openapi.Document(name)
	if err != nil {
		return nil, err
	}
	s := &Spec{name: name, schemas: map[string]*jsonschema.Schema{}}
	if err := json.Unmarshal(b, &s.doc); err != nil {
		return nil, fmt.Errorf("openapitest: %s: %w", name, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("openapitest: %s: %w", name, err)
	}
	// The whole document is one resource so that "#/components/schemas/X"
	// resolves; each body schema is compiled by its JSON pointer in it.
	base := "https://sandgate.invalid/" + name
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(base, doc); err != nil {
		return nil, fmt.Errorf("openapitest: %s: %w", name, err)
	}
	compile := func(content map[string]*MediaType, at ...string) error {
		for ct, mt := range content {
			if mt.Schema == nil || s.schemas[string(mt.Schema)] != nil {
				continue
			}
			ptr := pointer(append(at, "content", ct, "schema"))
			sch, err := c.Compile(base + "#" + ptr)
			if err != nil {
				return fmt.Errorf("openapitest: %s: %w", name, err)
			}
			s.schemas[string(mt.Schema)] = sch
		}
		return nil
	}
	for p, ops := range s.doc.Paths {
		for m, op := range ops {
			if op.RequestBody != nil {
				if err := compile(op.RequestBody.Content, "paths", p, m, "requestBody"); err != nil {
					return nil, err
				}
			}
			for st, r := range op.Responses {
				if err := compile(r.Content, "paths", p, m, "responses", st); err != nil {
					return nil, err
				}
			}
		}
	}
	for n, r := range s.doc.Components.Responses {
		if err := compile(r.Content, "components", "responses", n); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// pointer is the URI fragment of the JSON pointer to tokens.
func pointer(tokens []string) string {
	var sb strings.Builder
	r := strings.NewReplacer("~", "~0", "/", "~1")
	for _, t := range tokens {
		sb.WriteString("/" + url.PathEscape(r.Replace(t)))
	}
	return sb.String()
}

// Operation returns the operation of method on an actual request path
// (for example /v1/workspaces/ws_1/exec) and the template it matched.
func (s *Spec) Operation(method, path string) (*Operation, string, bool) {
	got := strings.Split(path, "/")
	for tmpl, ops := range s.doc.Paths {
		op, ok := ops[strings.ToLower(method)]
		if !ok {
			continue
		}
		want := strings.Split(tmpl, "/")
		if len(want) != len(got) {
			continue
		}
		match := true
		for i := range want {
			if want[i] != got[i] && !(strings.HasPrefix(want[i], "{") && got[i] != "") {
				match = false
				break
			}
		}
		if match {
			return op, tmpl, true
		}
	}
	return nil, "", false
}

// Operations returns every operation by "METHOD /template".
func (s *Spec) Operations() map[string]*Operation {
	out := map[string]*Operation{}
	for p, ops := range s.doc.Paths {
		for m, op := range ops {
			out[strings.ToUpper(m)+" "+p] = op
		}
	}
	return out
}

// Response returns the answer documented for status, shared ones resolved.
func (s *Spec) Response(op *Operation, status int) (*Response, bool) {
	r, ok := op.Responses[strconv.Itoa(status)]
	if !ok {
		return nil, false
	}
	if name, ok := strings.CutPrefix(r.Ref, "#/components/responses/"); ok {
		r, ok = s.doc.Components.Responses[name]
		return r, ok
	}
	return r, true
}

// CheckResponse reports how an answer to method path departs from the
// document: a status the operation does not list, a body where none is
// documented or the reverse, a content type other than JSON, or a body
// its schema refuses.
func (s *Spec) CheckResponse(method, path string, status int, h http.Header, body []byte) error {
	op, tmpl, ok := s.Operation(method, path)
	if !ok {
		return fmt.Errorf("%s %s: not in %s", method, path, s.name)
	}
	where := method + " " + tmpl + " " + strconv.Itoa(status)
	r, ok := s.Response(op, status)
	if !ok {
		return fmt.Errorf("%s: status not documented (body %.200s)", where, body)
	}
	mt := r.Content["application/json"]
	if mt == nil {
		if len(body) > 0 {
			return fmt.Errorf("%s: documented without a body, answered %d bytes", where, len(body))
		}
		return nil
	}
	if ct, params, err := mime.ParseMediaType(h.Get("Content-Type")); err != nil || ct != "application/json" ||
		(params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8")) {
		return fmt.Errorf("%s: Content-Type %q, want application/json", where, h.Get("Content-Type"))
	}
	if err := s.CheckJSON(mt.Schema, body); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// CheckJSON validates the JSON text body against schema, one of the body
// schemas of the document (a MediaType's Schema).
func (s *Spec) CheckJSON(schema json.RawMessage, body []byte) error {
	sch := s.schemas[string(schema)]
	if sch == nil {
		return fmt.Errorf("schema %.100s is not a body schema of %s", schema, s.name)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	err = sch.Validate(v)
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	// One line per failing value, each naming where it is in the body.
	var leaves []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e.Error())
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return errors.New(strings.Join(leaves, "; "))
}
