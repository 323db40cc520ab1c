package stripesync

// Every key this package writes is built here, and README.md beside this
// file lists them (type, TTL, owner) for store/README.md's table. An
// account's keys carry its hash tag {acct_…}, so the scripts below touch
// one Redis Cluster slot; the one global key is only used by single-key
// commands.

// prefix starts every key, as in billing and store.
const prefix = "sg:"

// settingsKey is an account's Stripe sync settings HASH: customer,
// event_name, unit, since (unix ms), updated_at (unix ms). No hash means
// the account is not synced. Example: sg:{acct_x}:stripe
func settingsKey(acct string) string { return prefix + "{" + acct + "}:stripe" }

// cursorKey is the STRING usage-ledger stream id of the last entry the
// sync is done with (sent, skipped or dead-lettered); absent means none
// yet. Example: sg:{acct_x}:stripe:cursor
func cursorKey(acct string) string { return prefix + "{" + acct + "}:stripe:cursor" }

// leaseKey is the STRING lease of the gateway syncing the account now: its
// owner id, with a TTL (PX). Example: sg:{acct_x}:stripe:lease
func leaseKey(acct string) string { return prefix + "{" + acct + "}:stripe:lease" }

// stateKey is the HASH of the account's sync state: sent, failures,
// dead_lettered (counters), last_error, last_error_at (unix ms),
// last_sent_at (unix ms), head_id and head_attempts (the entry at the
// cursor that failed with a 4xx, and how many rounds it did).
// Example: sg:{acct_x}:stripe:state
func stateKey(acct string) string { return prefix + "{" + acct + "}:stripe:state" }

// deadKey is the HASH of the account's dead letters: field the ledger
// entry id, value the JSON [DeadLetter]. Example: sg:{acct_x}:stripe:dead
func deadKey(acct string) string { return prefix + "{" + acct + "}:stripe:dead" }

// retryKey is the HASH of dead letters an operator requeued: field the
// entry id, value the JSON [DeadLetter]; the next round sends them first.
// Example: sg:{acct_x}:stripe:retry
func retryKey(acct string) string { return prefix + "{" + acct + "}:stripe:retry" }

// accountsKey is the global SET of the account ids with Stripe sync
// settings, the accounts [Syncer.Run] walks. Example: sg:stripe:accounts
func accountsKey() string { return prefix + "stripe:accounts" }
