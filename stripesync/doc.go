// Package stripesync sends each opted-in account's settled usage to Stripe
// Billing as meter events, exactly once per usage ledger entry as Stripe
// counts them.
//
// # What is sent
//
// Every entry of the account's usage ledger (billing's sg:{A}:usage
// stream) is read in ledger order, from a durable cursor. Interim entries
// ("<ws>:<unix>") are sent as well as final ones ("<ws>:final"): billing
// writes each id once and never edits it, and a workspace's final entry
// holds only the periods not yet accrued, so an interim entry is settled
// for its hour even though the workspace still runs. Sending it keeps
// Stripe an hour behind a long workspace instead of waiting for its end,
// and the seconds of all of a workspace's entries add up to its
// metered_seconds. Adjustments ("adj:<hash>") move money only: they are
// sent in [UnitMicros] (a negative one is dead-lettered, since a meter
// event cannot refund) and skipped in [UnitSeconds]. Entries with nothing
// to count (0) and entries filed before the account's [Account.Since] are
// skipped.
//
// Each event carries event_name (the account's meter), payload
// stripe_customer_id (the account's customer) and value (in the account's
// [Unit]), a timestamp inside the usage's hour (its period's start; an
// adjustment's time for an adjustment), and the identifier
// [Identifier](account, entry id), also sent as the Idempotency-Key.
//
// # Guarantees
//
// The cursor moves past an entry only after Stripe accepted its event (or
// it was skipped or dead-lettered), in a script fenced by the account's
// lease, so a restart resumes after the last entry sent and sends nothing
// twice. A crash between Stripe's answer and the cursor's move resends
// that one entry under the same identifier and Idempotency-Key, which
// Stripe counts once (it enforces identifier uniqueness for at least 24
// hours). A cancelled context between sends stops the round after the
// cursor moved. The usage ledger is read by stream id, with
// [billing.Ledger.ScanAfter], not with billing.Ledger.Scan: Scan filters by
// terminated_at, which is not in ledger order (an interim entry is filed
// under its period's start but appended an hour later), so a time cursor
// would miss entries.
//
// # Failures
//
// A 429, a 5xx or a network failure is retried in the round with
// exponential backoff, or after Retry-After when that is longer
// (stripe-go's own retries are off). A 401 or 403 is the key's or the
// account's: the round stops and retries next time, and no entry is
// dead-lettered. Any other 4xx is the entry's: after DeadAfter rounds it
// goes on the account's dead-letter list and the cursor moves on;
// [Syncer.Retry] requeues it. The secret key is read from the environment
// (SANDGATE_STRIPE_SECRET_KEY by default), kept as a [sandgate.Secret],
// and cut out of every error text; stripe-go's logger is off.
package stripesync
