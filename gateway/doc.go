// Package gateway is the HTTPS server of protocol v1: middleware (request
// id, no-store, body limit, TLS, authentication), one file per resource,
// idempotency, and the one error handler that writes the envelope.
package gateway
