// Package adminapi is the operator API's (/admin/v1) side that its users
// share: the request and answer types on the wire, the operator roles and
// the Go client that `sandgate admin` and the console drive the API with.
// It imports no HTTP framework and no store, so a client never links the
// server.
package adminapi
