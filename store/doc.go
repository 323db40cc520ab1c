// Package store keeps all of sandgate's state in Redis: accounts,
// instances, leases, workspaces, snapshots, durable commands and
// idempotency keys. Every state change that touches more than one key is
// one Lua script over keys of a single account; README.md beside this file
// lists every key.
package store
