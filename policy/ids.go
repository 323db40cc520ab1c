package policy

import (
	"strconv"

	"github.com/sandgate/sandgate/protocol"
)

// Lengths of the protocol's identifier grammars.
const (
	MaxIDLen              = 64  // workspace, snapshot and lease ids; X-Request-Id
	MaxIdempotencyKeyLen  = 200 // spec §Idempotency and retries
	MaxCommandIdentityLen = 128 // spec §Durable commands
	MaxLabelLen           = 128 // spec §Acquire, label
	maxAgentLen           = 64
)

// isIDByte reports whether c is in [A-Za-z0-9._-].
func isIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// isKeyByte reports whether c is in [A-Za-z0-9._:-], the charset of
// idempotency keys, command identities and labels.
func isKeyByte(c byte) bool { return isIDByte(c) || c == ':' }

// isHexByte reports whether c is a hexadecimal digit of either case.
func isHexByte(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// within reports whether s has min to max bytes, each accepted by ok.
func within(s string, minLen, maxLen int, ok func(byte) bool) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

// quoted returns " " followed by s in quotes when s is 1 to maxLen bytes,
// each accepted by safe, and "" otherwise. Messages use it to show a value
// only when it cannot carry content: "size" + quoted(…) + " is not allowed".
func quoted(s string, maxLen int, safe func(byte) bool) string {
	if !within(s, 1, maxLen, safe) {
		return ""
	}
	return " " + strconv.Quote(s)
}

// invalid returns an InvalidRequest refusal with msg.
func invalid(msg string) error { return protocol.E(protocol.InvalidRequest, msg) }

// ValidID reports whether s is a valid workspace, snapshot or lease id: 1 to
// 64 characters of [A-Za-z0-9._-], never "." or "..", so it is safe as a URL
// path segment (spec §Identifiers).
func ValidID(s string) bool {
	return s != "." && s != ".." && within(s, 1, MaxIDLen, isIDByte)
}

// ValidRequestID reports whether s is a usable X-Request-Id: 1 to 64
// characters of [A-Za-z0-9._-] (spec §Conventions). The gateway generates one
// when the client's is missing or invalid.
func ValidRequestID(s string) bool { return within(s, 1, MaxIDLen, isIDByte) }

// ValidateIdempotencyKey checks an Idempotency-Key header: 1 to 200
// characters of [A-Za-z0-9._:-]. Returns InvalidRequest when it is missing or
// malformed; a 400 consumes no key (spec §Idempotency and retries).
func ValidateIdempotencyKey(s string) error {
	if s == "" {
		return invalid("the Idempotency-Key header is required for this request")
	}
	if !within(s, 1, MaxIdempotencyKeyLen, isKeyByte) {
		return invalid("the Idempotency-Key header must be 1 to 200 characters of [A-Za-z0-9._:-]")
	}
	return nil
}

// ValidateCommandIdentity checks a durable command identity: 1 to 128
// characters of [A-Za-z0-9._:-] (spec §Durable commands). Returns
// InvalidRequest otherwise.
func ValidateCommandIdentity(s string) error {
	if !within(s, 1, MaxCommandIdentityLen, isKeyByte) {
		return invalid("the command identity must be 1 to 128 characters of [A-Za-z0-9._:-]")
	}
	return nil
}

// ValidateLabel checks an Acquire label: required, at most 128 characters of
// [A-Za-z0-9._:-]. Returns InvalidRequest otherwise.
func ValidateLabel(s string) error {
	if s == "" {
		return invalid("label is required: 1 to 128 characters of [A-Za-z0-9._:-]")
	}
	if !within(s, 1, MaxLabelLen, isKeyByte) {
		return invalid("label must be 1 to 128 characters of [A-Za-z0-9._:-]")
	}
	return nil
}

// ValidateAgent checks the optional attribution field agent: empty, or a slug
// matching ^[a-z0-9][a-z0-9-]{0,63}$. Returns InvalidRequest otherwise.
func ValidateAgent(s string) error {
	if s == "" {
		return nil
	}
	slug := func(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' }
	if s[0] == '-' || !within(s, 1, maxAgentLen, slug) {
		return invalid("agent must match ^[a-z0-9][a-z0-9-]{0,63}$, or be omitted")
	}
	return nil
}

// ValidateRunID checks the optional attribution field run_id: empty, or a
// UUID in the 8-4-4-4-12 hexadecimal form. Any version and either case is
// accepted; the broker only records it. Returns InvalidRequest otherwise.
func ValidateRunID(s string) error {
	if s == "" || isUUID(s) {
		return nil
	}
	return invalid("run_id must be a UUID (8-4-4-4-12 hexadecimal digits), or be omitted")
}

// isUUID reports whether s is 8-4-4-4-12 hexadecimal digits.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHexByte(s[i]) {
				return false
			}
		}
	}
	return true
}
