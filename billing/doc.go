// Package billing meters and charges workspaces: money in integer
// micro-units, rate cards, prepaid funds with holds, nested monthly budgets,
// the append-only usage ledger and the reconciliation of balances against it.
package billing
