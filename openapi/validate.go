package openapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Spec is a loaded document that checks requests and answers against its
// schemas. It understands the part of JSON Schema the documents use:
// $ref, type (one or a list), properties, required, additionalProperties,
// items, enum, allOf, minItems, minLength and format date-time.
type Spec struct {
	name string
	doc  struct {
		Paths      map[string]map[string]*Operation `json:"paths"`
		Components struct {
			Schemas   map[string]json.RawMessage `json:"schemas"`
			Responses map[string]*Response       `json:"responses"`
		} `json:"components"`
	}
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

// Load reads the embedded document name (V1 or Admin).
func Load(name string) (*Spec, error) {
	b, err := Document(name)
	if err != nil {
		return nil, err
	}
	s := &Spec{name: name}
	if err := json.Unmarshal(b, &s.doc); err != nil {
		return nil, fmt.Errorf("openapi: %s: %w", name, err)
	}
	return s, nil
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

// CheckJSON validates the JSON text body against schema.
func (s *Spec) CheckJSON(schema json.RawMessage, body []byte) error {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	return s.validate(schema, v, "$")
}

// schema is the part of a JSON Schema validate reads.
type schema struct {
	Ref                  string                     `json:"$ref"`
	Type                 json.RawMessage            `json:"type"`
	Properties           map[string]json.RawMessage `json:"properties"`
	Required             []string                   `json:"required"`
	AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	Items                json.RawMessage            `json:"items"`
	Enum                 []any                      `json:"enum"`
	AllOf                []json.RawMessage          `json:"allOf"`
	AnyOf                []json.RawMessage          `json:"anyOf"`
	MinItems             *int                       `json:"minItems"`
	MinLength            *int                       `json:"minLength"`
	Format               string                     `json:"format"`
}

func (s *Spec) validate(raw json.RawMessage, v any, at string) error {
	var sc schema
	if err := json.Unmarshal(raw, &sc); err != nil {
		return fmt.Errorf("%s: bad schema: %w", at, err)
	}
	if sc.Ref != "" {
		name, ok := strings.CutPrefix(sc.Ref, "#/components/schemas/")
		if !ok || s.doc.Components.Schemas[name] == nil {
			return fmt.Errorf("%s: $ref %s names no schema", at, sc.Ref)
		}
		return s.validate(s.doc.Components.Schemas[name], v, at)
	}
	for _, sub := range sc.AllOf {
		if err := s.validate(sub, v, at); err != nil {
			return err
		}
	}
	if len(sc.AnyOf) > 0 {
		var errs []string
		for _, sub := range sc.AnyOf {
			err := s.validate(sub, v, at)
			if err == nil {
				errs = nil
				break
			}
			errs = append(errs, err.Error())
		}
		if errs != nil {
			return fmt.Errorf("%s: matches none of anyOf: %s", at, strings.Join(errs, "; "))
		}
	}
	if len(sc.Type) > 0 {
		var types []string
		if err := json.Unmarshal(sc.Type, &types); err != nil {
			var one string
			if err := json.Unmarshal(sc.Type, &one); err != nil {
				return fmt.Errorf("%s: bad type %s", at, sc.Type)
			}
			types = []string{one}
		}
		if t := typeOf(v); !slices.Contains(types, t) && !(t == "integer" && slices.Contains(types, "number")) {
			return fmt.Errorf("%s: %s, want %s", at, t, strings.Join(types, " or "))
		}
	}
	if sc.Enum != nil && !slices.ContainsFunc(sc.Enum, func(e any) bool { return fmt.Sprint(e) == fmt.Sprint(v) && typeOf(e) == typeOf(v) }) {
		return fmt.Errorf("%s: %v is not one of %v", at, v, sc.Enum)
	}
	switch v := v.(type) {
	case string:
		if sc.MinLength != nil && len(v) < *sc.MinLength {
			return fmt.Errorf("%s: shorter than %d", at, *sc.MinLength)
		}
		if sc.Format == "date-time" {
			if _, err := time.Parse(time.RFC3339, v); err != nil {
				return fmt.Errorf("%s: %q is not an RFC 3339 time", at, v)
			}
		}
	case []any:
		if sc.MinItems != nil && len(v) < *sc.MinItems {
			return fmt.Errorf("%s: fewer than %d items", at, *sc.MinItems)
		}
		if sc.Items != nil {
			for i, e := range v {
				if err := s.validate(sc.Items, e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
					return err
				}
			}
		}
	case map[string]any:
		for _, r := range sc.Required {
			if _, ok := v[r]; !ok {
				return fmt.Errorf("%s: required %q is missing", at, r)
			}
		}
		for k, e := range v {
			if p, ok := sc.Properties[k]; ok {
				if err := s.validate(p, e, at+"."+k); err != nil {
					return err
				}
				continue
			}
			switch ap := strings.TrimSpace(string(sc.AdditionalProperties)); ap {
			case "", "true":
			case "false":
				return fmt.Errorf("%s: %q is not a documented property", at, k)
			default:
				if err := s.validate(sc.AdditionalProperties, e, at+"."+k); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// typeOf is v's JSON Schema type.
func typeOf(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if _, err := v.Int64(); err == nil {
			return "integer"
		}
		return "number"
	case float64:
		if v == float64(int64(v)) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}
