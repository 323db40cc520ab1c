package billing

// Every key billing writes is built here; store/README.md lists them with
// the rest. Keys of one account carry its hash tag {acct_…}, so settlement
// and admission scripts touch one Redis Cluster slot; global keys (rate
// cards) are only read by single-key commands.

const prefix = "sg:"

func tag(acct string) string { return prefix + "{" + acct + "}:" }

// usageKey is an account's usage ledger STREAM: field "e" the JSON
// [UsageEntry]. Example: sg:{acct_x}:usage
func usageKey(acct string) string { return tag(acct) + "usage" }

// usageIDsKey is the SET of entry ids already in the usage ledger, so a
// second append of one id is a no-op. Example: sg:{acct_x}:usage:ids
func usageIDsKey(acct string) string { return tag(acct) + "usage:ids" }
