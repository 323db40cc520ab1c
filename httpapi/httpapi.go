// Package httpapi is what both HTTP listeners share: the error envelope
// writer, the strict JSON decoder, request ids and Retry-After. It speaks
// net/http and protocol only, so either listener's router can use it.
package httpapi

import "github.com/sandgate/sandgate/protocol"

// ContentTypeJSON is the Content-Type of every JSON answer (spec
// §Conventions: bodies are application/json; charset=utf-8).
const ContentTypeJSON = "application/json; charset=utf-8"

// ErrNoRoute answers a request whose path no route serves, a trailing
// slash included: 400 invalid_request, never a 404, which the client
// reads as success for Release and DeleteSnapshot (docs/protocol-notes.md).
var ErrNoRoute = protocol.E(protocol.InvalidRequest, "no such route")
