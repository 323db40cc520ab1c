package openapi_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/openapi"
	"github.com/sandgate/sandgate/openapi/openapitest"
	"github.com/sandgate/sandgate/protocol"
)

// v1Types are the wire types of protocol v1 each schema of openapi/v1.json
// describes.
var v1Types = map[string]any{
	"Lease":            protocol.LeaseResponse{},
	"AcquireRequest":   protocol.AcquireRequest{},
	"Workspace":        protocol.Workspace{},
	"WorkspaceList":    protocol.WorkspaceList{},
	"ExecRequest":      protocol.ExecRequest{},
	"ExecResponse":     protocol.ExecResponse{},
	"ReadFileRequest":  protocol.ReadFileRequest{},
	"ReadFileResponse": protocol.ReadFileResponse{},
	"WriteFileRequest": protocol.WriteFileRequest{},
	"SnapshotRequest":  protocol.SnapshotRequest{},
	"Snapshot":         protocol.Snapshot{},
	"CommandStatus":    protocol.CommandStatus{},
	"ErrorEnvelope":    protocol.Envelope{},
}

// adminTypes are the wire types of the operator API each schema of
// openapi/admin-v1.json describes.
var adminTypes = map[string]any{
	"Account": adminapi.Account{}, "Instance": adminapi.Instance{}, "Provider": adminapi.Provider{}, "Lease": adminapi.Lease{},
	"IssuedToken": adminapi.IssuedToken{}, "Count": adminapi.Count{}, "RevokeResult": adminapi.RevokeResult{}, "Swept": adminapi.Swept{},
	"Status": adminapi.Status{}, "RiskLimits": adminapi.RiskLimits{}, "RateCard": adminapi.RateCard{}, "BillingSettings": adminapi.BillingSettings{},
	"FundsEntry": adminapi.FundsEntry{}, "Balance": adminapi.Balance{}, "Budget": adminapi.Budget{}, "Adjustment": admin.Adjustment{},
	"ReconcileReport": billing.Report{}, "StripeStatus": adminapi.StripeStatus{}, "StripeDeadLetter": adminapi.StripeDeadLetter{},
	"StripeRetryResult": adminapi.StripeRetryResult{}, "UsageSummary": adminapi.UsageSummary{}, "Statement": billing.Statement{},
	"Whoami": adminapi.Whoami{}, "Workspace": adminapi.Workspace{}, "WorkspaceList": adminapi.WorkspaceList{},
	"Image": adminapi.Image{}, "PullImageRequest": adminapi.PullImageRequest{}, "PullEvent": adminapi.PullEvent{},
	"CreateAccountRequest": adminapi.CreateAccountRequest{}, "CreateInstanceRequest": adminapi.CreateInstanceRequest{},
	"SetProviderRequest": adminapi.SetProviderRequest{}, "IssueTokenRequest": adminapi.IssueTokenRequest{}, "RevokeRequest": adminapi.RevokeRequest{},
	"StopRequest": adminapi.StopRequest{}, "PauseRequest": adminapi.PauseRequest{}, "ResumeRequest": adminapi.ResumeRequest{},
	"RateCardRequest": adminapi.RateCardRequest{}, "FundsRequest": adminapi.FundsRequest{}, "BudgetRequest": adminapi.BudgetRequest{},
	"AdjustmentRequest": adminapi.AdjustmentRequest{}, "StripeRetryRequest": adminapi.StripeRetryRequest{},
	"RateCardCurrencyRequest": adminapi.RateCardCurrencyRequest{},
	"ExecRequest":             adminapi.ExecRequest{}, "ExecResponse": adminapi.ExecResponse{}, "ReadFileRequest": adminapi.ReadFileRequest{},
	"ReadFileResponse": adminapi.ReadFileResponse{}, "WriteFileRequest": adminapi.WriteFileRequest{},
	"ErrorEnvelope": protocol.Envelope{}, "Empty": struct{}{},
	"WorkspaceDetail": adminapi.WorkspaceDetail{}, "AccountDetail": adminapi.AccountDetail{}, "RefusalCounts": adminapi.RefusalCounts{},
}

// requestTypes are decoded by the gateway: which of their fields are
// required is what the gateway refuses when absent (gateway's
// TestOpenAPIRequiredIsWhatTheServerRefuses), not the json tags.
var requestTypes = []string{"AcquireRequest", "ExecRequest", "ReadFileRequest", "WriteFileRequest", "SnapshotRequest",
	// The operator API's: their required fields are not compared yet.
	"CreateAccountRequest", "CreateInstanceRequest", "SetProviderRequest", "IssueTokenRequest", "RevokeRequest", "StopRequest",
	"PauseRequest", "ResumeRequest", "RateCardRequest", "FundsRequest", "BudgetRequest", "AdjustmentRequest",
	"StripeRetryRequest", "RateCardCurrencyRequest", "BillingSettings", "RiskLimits"}

// TestSchemasAreTheWireTypes: every schema of both documents names
// exactly the json fields of the wire type the server encodes or decodes,
// nested objects included, with a JSON type that fits the Go type; an
// answer's required fields are those the encoder always sends (no
// omitempty), and its objects admit no other property.
func TestSchemasAreTheWireTypes(t *testing.T) {
	t.Run(openapi.V1, func(t *testing.T) { schemasAreTypes(t, openapi.V1, v1Types) })
	t.Run(openapi.Admin, func(t *testing.T) { schemasAreTypes(t, openapi.Admin, adminTypes) })
}

func schemasAreTypes(t *testing.T, name string, types map[string]any) {
	var doc struct {
		Components struct {
			Schemas map[string]*jsonSchema `json:"schemas"`
		} `json:"components"`
	}
	b, err := openapi.Document(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for name, v := range types {
		sc := doc.Components.Schemas[name]
		if sc == nil {
			t.Errorf("no schema %s", name)
			continue
		}
		compare(t, name, sc, reflect.TypeOf(v), !slices.Contains(requestTypes, name))
	}
	for name := range doc.Components.Schemas {
		if _, ok := types[name]; !ok {
			t.Errorf("schema %s describes no wire type (add it to the test's types)", name)
		}
	}
}

// jsonSchema is the part of a schema the type comparison reads.
type jsonSchema struct {
	Ref                  string                 `json:"$ref"`
	Type                 any                    `json:"type"`
	Enum                 []any                  `json:"enum"`
	Properties           map[string]*jsonSchema `json:"properties"`
	Required             []string               `json:"required"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Items                *jsonSchema            `json:"items"`
}

func (s *jsonSchema) types() []string {
	switch v := s.Type.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, e.(string))
		}
		return out
	}
	return nil
}

// compare checks the schema at path against Go type t.
func compare(t *testing.T, path string, sc *jsonSchema, typ reflect.Type, answer bool) {
	t.Helper()
	nullable := false
	if typ.Kind() == reflect.Pointer {
		typ, nullable = typ.Elem(), true
	}
	if sc.Ref != "" {
		return // the referenced schema is compared under its own name
	}
	var want string
	switch k := typ.Kind(); {
	case typ == reflect.TypeOf(time.Time{}) || k == reflect.String:
		want = "string"
	case k == reflect.Bool:
		want = "boolean"
	case k >= reflect.Int && k <= reflect.Uint64:
		want = "integer"
	case k == reflect.Float32 || k == reflect.Float64:
		want = "number"
	case k == reflect.Slice && typ.Elem().Kind() == reflect.Uint8, k == reflect.Interface:
		return // raw JSON: any value
	case k == reflect.Slice:
		want = "array"
	case k == reflect.Map || k == reflect.Struct:
		want = "object"
	}
	got := sc.types()
	if sc.Enum != nil && got == nil {
		for _, e := range sc.Enum {
			if s, ok := e.(string); ok && want != "string" {
				t.Errorf("%s: enum value %q for a Go %s", path, s, typ)
			}
		}
	} else if !slices.Contains(got, want) {
		t.Errorf("%s: type %v, want %s (Go %s)", path, got, want, typ)
	}
	if nullable && answer && sc.Enum == nil && !slices.Contains(got, "null") && typ.Kind() != reflect.Struct {
		t.Errorf("%s: Go %s can be null; the schema's type %v does not allow it", path, typ, got)
	}
	switch {
	case typ.Kind() == reflect.Slice:
		if sc.Items == nil {
			t.Errorf("%s: an array without items", path)
			return
		}
		compare(t, path+"[]", sc.Items, typ.Elem(), answer)
	case typ.Kind() == reflect.Struct && typ != reflect.TypeOf(time.Time{}):
		var fields, always []string
		for _, f := range jsonFields(typ) {
			fields = append(fields, f.name)
			if !f.omitempty {
				always = append(always, f.name)
			}
			p := sc.Properties[f.name]
			if p == nil {
				t.Errorf("%s: the server's %s.%s (json %q) is not a property", path, typ.Name(), f.goName, f.name)
				continue
			}
			ft := f.typ
			if ft.Kind() == reflect.Pointer && f.omitempty {
				ft = ft.Elem() // absent when nil, never null
			}
			compare(t, path+"."+f.name, p, ft, answer)
		}
		for name := range sc.Properties {
			if !slices.Contains(fields, name) {
				t.Errorf("%s: property %q is no field of Go %s", path, name, typ)
			}
		}
		if path == "ErrorEnvelope.error.details" {
			return
		}
		if sc.AdditionalProperties != false {
			t.Errorf("%s: additionalProperties %v; want false: a request with another field is refused, and an answer has no other", path, sc.AdditionalProperties)
		}
		if !answer {
			return
		}
		if typ == reflect.TypeOf(protocol.CommandStatus{}) {
			// Its MarshalJSON sends the state alone until the exit fields
			// exist, then all of them.
			always = []string{"state"}
		}
		slices.Sort(always)
		req := slices.Sorted(slices.Values(sc.Required))
		if !slices.Equal(req, always) {
			t.Errorf("%s: required %v; the server always sends %v", path, req, always)
		}
	case typ.Kind() == reflect.Map:
		if sc.AdditionalProperties == nil && path != "ErrorEnvelope.error.details" {
			t.Errorf("%s: a map without additionalProperties", path)
		}
	}
}

// jsonField is one field of a struct as encoding/json sees it.
type jsonField struct {
	name, goName string
	omitempty    bool
	typ          reflect.Type
}

// jsonFields lists typ's json fields, embedded structs' fields inlined.
func jsonFields(typ reflect.Type) []jsonField {
	var out []jsonField
	for f := range typ.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			out = append(out, jsonFields(ft)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{name: name, goName: f.Name, omitempty: strings.Contains(opts, "omitempty"), typ: f.Type})
	}
	return out
}

// specErrors are the error codes the spec lists per operation ("Errors:"
// lines and the durable commands section), by operationId; every
// operation may also answer the codes of authentication and the request
// envelope, checked in TestV1ErrorCodes.
var specErrors = map[string][]protocol.Code{
	"acquire": {protocol.InvalidRequest, protocol.Unauthenticated, protocol.InsufficientFunds, protocol.BudgetExhausted,
		protocol.Paused, protocol.EmergencyStopped, protocol.NotFound, protocol.IdempotencyConflict, protocol.IdempotencyInProgress,
		protocol.SnapshotGone, protocol.SizeNotAllowed, protocol.ImageNotAllowed, protocol.EgressRequired, protocol.EgressNotAllowed,
		protocol.ConcurrencyLimit, protocol.RiskLimit, protocol.RateLimited, protocol.UpstreamError, protocol.AdmissionUnavailable},
	"exec":           {protocol.NotFound, protocol.WorkspaceGone, protocol.WorkspaceNotReady, protocol.PayloadTooLarge, protocol.UpstreamError},
	"readFile":       {protocol.FileNotFound, protocol.NotFound, protocol.WorkspaceGone, protocol.FileTooLarge, protocol.NotAFile},
	"writeFile":      {protocol.NotFound, protocol.WorkspaceGone, protocol.PayloadTooLarge, protocol.NotAFile},
	"createSnapshot": {protocol.NotFound, protocol.WorkspaceGone, protocol.SnapshotQuotaExceeded, protocol.UpstreamError},
	"deleteSnapshot": {protocol.NotFound},
	"release":        {protocol.NotFound},
	"startCommand":   {protocol.CommandNotStarted, protocol.NotFound, protocol.WorkspaceGone},
	"readCommand":    {protocol.WorkspaceGone},
}

// everyOperation are the codes any operation can answer, by document: a
// malformed request or id, the token's states (and role), the request
// rate, a bug, and a broker that cannot reach its state.
var everyOperation = map[string][]protocol.Code{
	openapi.V1: {protocol.InvalidRequest, protocol.Unauthenticated, protocol.LeaseExpired, protocol.LeaseSuperseded,
		protocol.LeaseRevoked, protocol.RateLimited, protocol.Internal, protocol.Unavailable, protocol.AdmissionUnavailable},
	openapi.Admin: {protocol.InvalidRequest, protocol.Unauthenticated, protocol.Forbidden, protocol.Internal, protocol.Unavailable},
}

// TestErrorCodes: every operation lists its refusals by status, each a
// schema that narrows the envelope's code to an enum; every code listed is
// a protocol code of that status (forbidden and conflict only in the
// operator API's); the spec's codes for each v1 operation and the codes
// of every operation are all there.
func TestErrorCodes(t *testing.T) { eachSpec(t, errorCodes) }

// eachSpec runs f on each document, loaded, in a subtest of its name.
func eachSpec(t *testing.T, f func(t *testing.T, name string, spec *openapitest.Spec)) {
	for _, name := range []string{openapi.V1, openapi.Admin} {
		t.Run(name, func(t *testing.T) {
			spec, err := openapitest.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			f(t, name, spec)
		})
	}
}

func errorCodes(t *testing.T, name string, spec *openapitest.Spec) {
	for route, op := range spec.Operations() {
		listed := map[protocol.Code]bool{}
		for st := range op.Responses {
			status, err := strconv.Atoi(st)
			if err != nil {
				t.Errorf("%s: response %q is not a status (no default: every refusal is listed)", route, st)
				continue
			}
			if status < 400 {
				continue
			}
			r, _ := spec.Response(op, status)
			codes := enumCodes(t, r)
			if len(codes) == 0 {
				t.Errorf("%s %d: no code enum", route, status)
			}
			for _, c := range codes {
				if c.Status() != status || (c == protocol.Internal) != (status == http.StatusInternalServerError) {
					t.Errorf("%s %d: code %q is a protocol code of status %d", route, status, c, c.Status())
				}
				if name == openapi.V1 && (c == protocol.Forbidden || c == protocol.Conflict) {
					t.Errorf("%s %d: %q is an operator API code, not a v1 one", route, status, c)
				}
				listed[c] = true
			}
		}
		want := slices.Clone(everyOperation[name])
		if name == openapi.V1 {
			want = append(want, specErrors[op.ID]...)
		}
		for _, c := range want {
			if !listed[c] {
				t.Errorf("%s (%s): code %q is not documented", route, op.ID, c)
			}
		}
	}
}

// enumCodes reads the code enum of an error answer's schema (allOf the
// envelope and a narrowing).
func enumCodes(t *testing.T, r *openapitest.Response) []protocol.Code {
	t.Helper()
	mt := r.Content["application/json"]
	if mt == nil {
		return nil
	}
	var sc struct {
		AllOf []struct {
			Properties struct {
				Error struct {
					Properties struct {
						Code struct {
							Enum []protocol.Code `json:"enum"`
						} `json:"code"`
					} `json:"properties"`
				} `json:"error"`
			} `json:"properties"`
		} `json:"allOf"`
	}
	if err := json.Unmarshal(mt.Schema, &sc); err != nil {
		t.Fatal(err)
	}
	var out []protocol.Code
	for _, a := range sc.AllOf {
		out = append(out, a.Properties.Error.Properties.Code.Enum...)
	}
	return out
}

// TestExamples: every operation has an example request body (when it
// takes one) and an example of every answer with a body, and each JSON
// one validates against its own schema.
func TestExamples(t *testing.T) { eachSpec(t, examples) }

func examples(t *testing.T, _ string, spec *openapitest.Spec) {
	for route, op := range spec.Operations() {
		if op.RequestBody != nil {
			mt := op.RequestBody.Content["application/json"]
			if mt == nil || mt.Example == nil {
				t.Errorf("%s: no request example", route)
			} else if err := spec.CheckJSON(mt.Schema, mt.Example); err != nil {
				t.Errorf("%s: the request example: %v", route, err)
			}
		}
		for st := range op.Responses {
			status, _ := strconv.Atoi(st)
			r, ok := spec.Response(op, status)
			if !ok {
				t.Errorf("%s %s: names no shared response", route, st)
				continue
			}
			for ct, mt := range r.Content {
				if mt.Example == nil {
					t.Errorf("%s %s: no %s example", route, st, ct)
				}
			}
			mt := r.Content["application/json"]
			if mt == nil || mt.Example == nil {
				continue
			}
			h := http.Header{"Content-Type": {"application/json; charset=utf-8"}}
			path := regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllString(strings.SplitN(route, " ", 2)[1], "x1")
			if err := spec.CheckResponse(strings.SplitN(route, " ", 2)[0], path, status, h, mt.Example); err != nil {
				t.Errorf("%s %s: the example: %v", route, st, err)
			}
		}
	}
}

// TestCheckResponseRefuses: the checker the e2e suite relies on refuses
// an undocumented status, an undocumented field, a missing required field,
// a code outside the status's enum and a body on a 204.
func TestCheckResponseRefuses(t *testing.T) {
	spec, err := openapitest.Load(openapi.V1)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"application/json; charset=utf-8"}}
	ok := `{"snapshot_id":"snap_1","created_at":"2026-10-13T21:04:05Z","expires_at":"2026-10-27T21:04:05Z"}`
	if err := spec.CheckResponse("POST", "/v1/workspaces/ws_1/snapshots", 201, h, []byte(ok)); err != nil {
		t.Fatalf("a documented answer: %v", err)
	}
	for _, c := range []struct {
		what, method, path string
		status             int
		body               string
	}{
		{"undocumented status", "POST", "/v1/workspaces/ws_1/snapshots", 418, `{}`},
		{"extra field", "POST", "/v1/workspaces/ws_1/snapshots", 201, ok[:len(ok)-1] + `,"size":1}`},
		{"missing field", "POST", "/v1/workspaces/ws_1/snapshots", 201, `{"snapshot_id":"snap_1"}`},
		{"bad time", "POST", "/v1/workspaces/ws_1/snapshots", 201, strings.Replace(ok, "21:04:05Z", "yesterday", 1)},
		{"code of another status", "GET", "/v1/workspaces/ws_1", 404, `{"error":{"code":"file_not_found","message":"m","retryable":false,"details":{}}}`},
		{"body on 204", "POST", "/v1/workspaces/ws_1/files/write", 204, `{}`},
		{"unknown route", "GET", "/v1/nothing", 200, `{}`},
	} {
		if err := spec.CheckResponse(c.method, c.path, c.status, h, []byte(c.body)); err == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
}
