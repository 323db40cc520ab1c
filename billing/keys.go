package billing

// Every key billing writes is built here; store/README.md lists them with
// the rest. Keys of one account carry its hash tag {acct_…}, so settlement
// and admission scripts touch one Redis Cluster slot; global keys (rate
// cards) are only read by single-key commands.

// prefix starts every key. An account's keys are "sg:{<account>}:…",
// each built in one concatenation (one allocation).
const prefix = "sg:"

// usageKey is an account's usage ledger STREAM: field "e" the JSON
// [UsageEntry]. Example: sg:{acct_x}:usage
func usageKey(acct string) string { return prefix + "{" + acct + "}:usage" }

// usageIDsKey is the SET of entry ids already in the usage ledger, so a
// second append of one id is a no-op. Example: sg:{acct_x}:usage:ids
func usageIDsKey(acct string) string { return prefix + "{" + acct + "}:usage:ids" }

// adjustSeqKey is the STRING count of the usage adjustments appended to an
// account's ledger: an adjustment checks, as it writes, that none was
// appended since it read the ledger. Example: sg:{acct_x}:usage:adjseq
func adjustSeqKey(acct string) string { return prefix + "{" + acct + "}:usage:adjseq" }

// rateCardKey is a rate card's HASH: field "latest" its newest version,
// field "<version>" that version's JSON, field "latest_create" the random
// id of the create that made the newest (a resend of it is recognised).
// Global: read by single commands.
// Example: sg:ratecard:standard
func rateCardKey(name string) string { return prefix + "ratecard:" + name }

// rateCardsKey is the SET of every rate card name. Example: sg:ratecards
func rateCardsKey() string { return prefix + "ratecards" }

// poolKey is the HASH of one UTC day's (YYYYMMDD) warm-pool time: field
// "<HH>|<provider>|<size>|<image>" (HH the UTC hour, 00 to 23; the image
// last, as it may hold any character), value the integer milliseconds
// the pool's sandboxes of that provider, size and image were warm in
// that hour, summed over every broker. Global, written by single-key
// commands; it expires PoolRetention after its day ends.
// Example: sg:pool:20260315
func poolKey(day string) string { return prefix + "pool:" + day }

// settingsKey is an account's billing settings HASH: configured, rate_card,
// currency, credit_limit (micros), postpaid. Example: sg:{acct_x}:billing
func settingsKey(acct string) string { return prefix + "{" + acct + "}:billing" }

// fundsKey is an account's funds HASH of int64 micro-unit counters:
// balance, holds, settled, credits, debits. Example: sg:{acct_x}:funds
func fundsKey(acct string) string { return prefix + "{" + acct + "}:funds" }

// holdsKey is the HASH of an account's open holds: field workspace id,
// value the micro-units held. Example: sg:{acct_x}:holds
func holdsKey(acct string) string { return prefix + "{" + acct + "}:holds" }

// fundsLedgerKey is the STREAM of an account's operator credits and debits,
// field "e" the JSON [FundsEntry]. Example: sg:{acct_x}:funds:ledger
func fundsLedgerKey(acct string) string { return prefix + "{" + acct + "}:funds:ledger" }

// fundsIDsKey is the HASH of the idempotency keys of an account's credits
// and debits: field the key, value the entry JSON.
// Example: sg:{acct_x}:funds:ids
func fundsIDsKey(acct string) string { return prefix + "{" + acct + "}:funds:ids" }

// budgetsKey is the HASH of an account's monthly budgets: field the scope
// ("a", "i:<inst>", "g:<agent>", "i:<inst>:g:<agent>"), value the cap in
// micros; field "<scope>:soft" is "1" for an alert-only budget.
// Example: sg:{acct_x}:budgets
func budgetsKey(acct string) string { return prefix + "{" + acct + "}:budgets" }

// spendKey is the HASH of a calendar month's (UTC) spending per scope:
// "<scope>:h" open holds admitted that month, "<scope>:s" settled that
// month. Example: sg:{acct_x}:spend:202603
func spendKey(acct, month string) string { return prefix + "{" + acct + "}:spend:" + month }

// alertedKey is the SET of "<scope>:<percent>" budget thresholds already
// alerted in a month. Example: sg:{acct_x}:alerted:202603
func alertedKey(acct, month string) string { return prefix + "{" + acct + "}:alerted:" + month }

// alertsKey is the LIST of budget alerts not yet written to the audit
// log (JSON). Example: sg:{acct_x}:alerts
func alertsKey(acct string) string { return prefix + "{" + acct + "}:alerts" }

// Webhook deliveries live in one hash slot, {webhook}, so that the
// scripts below touch one Redis Cluster slot.

// webhookDueKey is the ZSET of alert deliveries, score the unix ms at
// which each is next due (a claimed delivery is pushed past its attempt's
// end, so a deliverer that dies hands it back). Example: sg:{webhook}:due
func webhookDueKey() string { return prefix + "{webhook}:due" }

// webhookDeliveriesKey is the HASH of pending deliveries: field the event
// id, value the JSON [delivery]. Example: sg:{webhook}:deliveries
func webhookDeliveriesKey() string { return prefix + "{webhook}:deliveries" }

// webhookDoneKey marks a delivered (or abandoned) event id, so a second
// enqueue of it is a no-op. Example: sg:{webhook}:done:bga_…
func webhookDoneKey(id string) string { return prefix + "{webhook}:done:" + id }

// webhookDeadKey is the LIST of event ids given up on, newest last, capped.
// Example: sg:{webhook}:dead
func webhookDeadKey() string { return prefix + "{webhook}:dead" }
