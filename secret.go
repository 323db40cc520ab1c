package sandgate

import "log/slog"

// Secret is a string that must never reach a log line, a trace or an error
// message: a bearer token or an operator token. Its String, GoString and
// LogValue methods all return REDACTED; only Reveal returns the value.
type Secret string

// Reveal returns the raw secret. Call it only where the value is sent or hashed.
func (s Secret) Reveal() string { return string(s) }

// String returns REDACTED.
func (Secret) String() string { return "REDACTED" }

// GoString returns REDACTED.
func (Secret) GoString() string { return "REDACTED" }

// LogValue returns REDACTED.
func (Secret) LogValue() slog.Value { return slog.StringValue("REDACTED") }

// Interface guards
var _ slog.LogValuer = Secret("")
