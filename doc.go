// Package sandgate holds the domain types of the sandgate execution broker:
// accounts, instances, leases, workspaces, snapshots, durable commands,
// scopes and sizes, shared by every other package. It imports only the
// standard library.
package sandgate
