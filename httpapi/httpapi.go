// Package httpapi is what both HTTP listeners share: the error envelope
// writer, the strict JSON decoder, request ids and Retry-After. It speaks
// net/http and protocol only, so either listener's router can use it.
package httpapi
