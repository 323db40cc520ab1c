package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// MaxEnvBytes bounds an Acquire's env: the bytes of every key and value
// together (spec §Acquire, env).
const MaxEnvBytes = 32 << 10

const maxEnvKeyLen = 128

// ValidateEnv checks an Acquire's env: at most maxEntries entries, each key
// matching ^[A-Za-z_][A-Za-z0-9_]{0,127}$, keys and values together at most
// [MaxEnvBytes]. A nil or empty env is valid.
//
// maxEntries is the scope's MaxEnvEntries after Limits.WithDefaults; a value
// of 0 or less allows no entries (fail closed).
//
// A value may be empty or hold any bytes but NUL: a process environment is a
// list of NUL-terminated strings, so a NUL would silently cut the value short
// in the sandbox. Refusing it is the only answer that neither alters the
// value nor hides it.
//
// Returns InvalidRequest. The message never carries a value, nor a key that
// failed its grammar; it names a valid key whose value holds a NUL. Keys are
// checked in sorted order, so the same env always gets the same answer.
func ValidateEnv(env map[string]string, maxEntries int) error {
	if len(env) > maxEntries {
		return invalid(fmt.Sprintf("env has %d entries; this instance allows at most %d (max_env_entries)",
			len(env), max(maxEntries, 0)))
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !validEnvKey(k) {
			return invalid("env has a key that does not match ^[A-Za-z_][A-Za-z0-9_]{0,127}$")
		}
		v := env[k]
		if strings.IndexByte(v, 0) >= 0 {
			// k passed its grammar, so it is safe to name.
			return invalid(fmt.Sprintf("env value of %s contains a NUL byte, which a process environment cannot carry", k))
		}
		total += len(k) + len(v)
	}
	if total > MaxEnvBytes {
		return invalid(fmt.Sprintf("env keys and values total %d bytes; the limit is %d (32 KiB)", total, MaxEnvBytes))
	}
	return nil
}

// validEnvKey reports whether k matches ^[A-Za-z_][A-Za-z0-9_]{0,127}$.
func validEnvKey(k string) bool {
	word := func(c byte) bool {
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
	}
	return within(k, 1, maxEnvKeyLen, word) && !('0' <= k[0] && k[0] <= '9')
}
