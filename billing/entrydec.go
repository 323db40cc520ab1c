package billing

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// parseEntry decodes the JSON of a ledger entry into e without
// encoding/json's reflection, taking its strings as substrings of s (no
// copy). It knows the form json.Marshal gives a UsageEntry: one flat
// object of the fields of UsageEntry, strings, integers, booleans and RFC
// 3339 times. It returns false for anything else (an escape in a string,
// a field it does not know, a number it cannot take), and the caller then
// decodes with encoding/json, which stays the reference for every entry.
func parseEntry(s string, e *UsageEntry) bool {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return skipSpace(s, i+1) == len(s)
	}
	for {
		key, j, ok := plainString(s, i)
		if !ok {
			return false
		}
		i = skipSpace(s, j)
		if i >= len(s) || s[i] != ':' {
			return false
		}
		i = skipSpace(s, i+1)
		if i, ok = parseField(s, i, key, e); !ok {
			return false
		}
		i = skipSpace(s, i)
		if i >= len(s) {
			return false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
		case '}':
			return skipSpace(s, i+1) == len(s)
		default:
			return false
		}
	}
}

// parseField decodes the value at s[i:] into the field of e named key.
func parseField(s string, i int, key string, e *UsageEntry) (int, bool) {
	var str *string
	var num *int64
	var tm *time.Time
	switch key {
	case "id":
		str = &e.ID
	case "kind":
		str = &e.Kind
	case "account_id":
		str = &e.AccountID
	case "instance_id":
		str = &e.InstanceID
	case "workspace_id":
		str = &e.WorkspaceID
	case "agent":
		str = &e.Agent
	case "run_id":
		str = &e.RunID
	case "size":
		str = &e.Size
	case "image":
		str = &e.Image
	case "provider":
		str = &e.Provider
	case "rate_card":
		str = &e.RateCard
	case "currency":
		str = &e.Currency
	case "termination_reason":
		str = &e.TerminationReason
	case "corrects":
		str = &e.Corrects
	case "reason":
		str = &e.Reason
	case "actor":
		str = &e.Actor
	case "unit_price_micros":
		num = &e.UnitPriceMicros
	case "seconds":
		num = &e.Seconds
	case "amount_micros":
		num = &e.AmountMicros
	case "egress_bytes_out":
		num = &e.EgressBytesOut
	case "egress_bytes_in":
		num = &e.EgressBytesIn
	case "started_at":
		tm = &e.StartedAt
	case "ended_at":
		tm = &e.EndedAt
	case "terminated_at":
		tm = &e.TerminatedAt
	case "final":
		switch {
		case len(s) >= i+4 && s[i:i+4] == "true":
			e.Final = true
			return i + 4, true
		case len(s) >= i+5 && s[i:i+5] == "false":
			e.Final = false
			return i + 5, true
		}
		return i, false
	case "rate_card_version":
		var v int64
		j, ok := parseInt(s, i, &v)
		if !ok || int64(int(v)) != v {
			return i, false
		}
		e.RateCardVersion = int(v)
		return j, true
	default:
		return i, false
	}
	switch {
	case str != nil:
		v, j, ok := plainString(s, i)
		*str = v
		return j, ok
	case num != nil:
		return parseInt(s, i, num)
	}
	v, j, ok := plainString(s, i)
	if !ok {
		return i, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return i, false
	}
	*tm = t
	return j, true
}

// plainString returns the JSON string at s[i:] when it holds no escape
// (and no control character), and the index after it.
func plainString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", i, false
	}
	n := strings.IndexByte(s[i+1:], '"')
	if n < 0 {
		return "", i, false
	}
	v := s[i+1 : i+1+n]
	if !plain(v) {
		return "", i, false
	}
	return v, i + 2 + n, true
}

// plain reports whether v holds no backslash and no control character,
// eight bytes at a time: a ledger row's strings are most of its bytes.
func plain(v string) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	k := 0
	for ; k+8 <= len(v); k += 8 {
		x := binary.LittleEndian.Uint64([]byte(v[k : k+8]))
		// A byte below 0x20, or equal to '\\' (its xor zero), sets its
		// high bit here (the classic "has a byte less than n" test);
		// bytes of 0x80 and above never do.
		y := x ^ ('\\' * ones)
		if ((x-0x20*ones)&^x|(y-ones)&^y)&highs != 0 {
			return false
		}
	}
	for ; k < len(v); k++ {
		if c := v[k]; c == '\\' || c < 0x20 {
			return false
		}
	}
	return true
}

// parseInt parses the JSON integer at s[i:] (no fraction, no exponent).
func parseInt(s string, i int, v *int64) (int, bool) {
	j := i
	if j < len(s) && s[j] == '-' {
		j++
	}
	for j < len(s) && '0' <= s[j] && s[j] <= '9' {
		j++
	}
	if j < len(s) && (s[j] == '.' || s[j] == 'e' || s[j] == 'E') {
		return i, false
	}
	n, err := strconv.ParseInt(s[i:j], 10, 64)
	if err != nil {
		return i, false
	}
	*v = n
	return j, true
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// decodeEntryJSON decodes s into e: by parseEntry when it can, else by
// encoding/json.
func decodeEntryJSON(s string, e *UsageEntry) error {
	if parseEntry(s, e) {
		return nil
	}
	// Only this path makes an entry escape to the heap: the caller's stays
	// where it is.
	var ref UsageEntry
	err := json.Unmarshal([]byte(s), &ref)
	*e = ref
	return err
}
