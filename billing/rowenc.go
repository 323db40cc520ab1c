package billing

import (
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Hand-written row encoders of usage exports: each row is appended to one
// buffer the export reuses, with strconv.Append* and time.AppendFormat,
// so that a row costs no allocation. They write exactly what encoding/csv
// (UseCRLF) and encoding/json (SetEscapeHTML(false)) wrote for an
// [ExportRow]; testdata/export.* are the golden files.

// appendCSVRow appends e as one CSV record of [Columns], CRLF-terminated.
func appendCSVRow(b []byte, e *UsageEntry) []byte {
	b = appendCSVField(b, e.ID)
	b = appendCSVField(append(b, ','), e.Kind)
	b = strconv.AppendBool(append(b, ','), e.Final)
	b = appendCSVField(append(b, ','), e.AccountID)
	b = appendCSVField(append(b, ','), e.InstanceID)
	b = appendCSVField(append(b, ','), e.WorkspaceID)
	b = appendCSVField(append(b, ','), e.Agent)
	b = appendCSVField(append(b, ','), e.RunID)
	b = appendCSVField(append(b, ','), e.Size)
	b = appendCSVField(append(b, ','), e.Image)
	b = appendCSVField(append(b, ','), e.Provider)
	b = appendCSVField(append(b, ','), e.RateCard)
	b = strconv.AppendInt(append(b, ','), int64(e.RateCardVersion), 10)
	b = appendCSVField(append(b, ','), e.Currency)
	b = appendMicros(append(b, ','), e.UnitPriceMicros)
	b = strconv.AppendInt(append(b, ','), e.UnitPriceMicros, 10)
	b = strconv.AppendInt(append(b, ','), e.Seconds, 10)
	b = appendMinor(append(b, ','), e.AmountMicros, e.Currency)
	b = strconv.AppendInt(append(b, ','), e.AmountMicros, 10)
	b = appendExportTime(append(b, ','), e.StartedAt)
	b = appendExportTime(append(b, ','), e.EndedAt)
	b = appendExportTime(append(b, ','), e.TerminatedAt)
	b = appendCSVField(append(b, ','), e.TerminationReason)
	b = appendCSVField(append(b, ','), e.Corrects)
	b = strconv.AppendInt(append(b, ','), e.EgressBytesOut, 10)
	b = strconv.AppendInt(append(b, ','), e.EgressBytesIn, 10)
	b = appendCSVField(append(b, ','), csvText(e.Reason))
	b = appendCSVField(append(b, ','), e.Actor)
	return append(b, '\r', '\n')
}

// csvText is free text (an operator's reason, often pasted from a
// customer's ticket) as a CSV field a spreadsheet shows as text: one that
// starts with =, +, -, @, a tab or a CR would be run as a formula, so it
// gets a leading ' (OWASP's advice for CSV injection).
func csvText(s string) string {
	if s != "" && strings.IndexByte("=+-@\t\r", s[0]) >= 0 {
		return "'" + s
	}
	return s
}

// appendCSVField appends one field as encoding/csv's Writer (comma ',',
// UseCRLF) writes it: quoted when it holds a comma, a quote or a line
// break, starts with a space, or is `\.`; inside quotes a quote is
// doubled, CR is dropped and LF becomes CRLF.
func appendCSVField(b []byte, s string) []byte {
	if !csvNeedsQuotes(s) {
		return append(b, s...)
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			b = append(b, '"', '"')
		case '\r':
		case '\n':
			b = append(b, '\r', '\n')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func csvNeedsQuotes(s string) bool {
	if s == "" {
		return false
	}
	if s == `\.` {
		return true
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\n', '\r', '"', ',':
			return true
		}
	}
	r, _ := utf8.DecodeRuneInString(s)
	return unicode.IsSpace(r)
}

// appendJSONRow appends e as one [ExportRow] JSON object and a LF.
func appendJSONRow(b []byte, e *UsageEntry) []byte {
	b = appendJSONString(append(b, `{"id":`...), e.ID)
	b = appendJSONString(append(b, `,"kind":`...), e.Kind)
	b = strconv.AppendBool(append(b, `,"final":`...), e.Final)
	b = appendJSONString(append(b, `,"account_id":`...), e.AccountID)
	b = appendJSONString(append(b, `,"instance_id":`...), e.InstanceID)
	b = appendJSONString(append(b, `,"workspace_id":`...), e.WorkspaceID)
	b = appendJSONString(append(b, `,"agent":`...), e.Agent)
	b = appendJSONString(append(b, `,"run_id":`...), e.RunID)
	b = appendJSONString(append(b, `,"size":`...), e.Size)
	b = appendJSONString(append(b, `,"image":`...), e.Image)
	b = appendJSONString(append(b, `,"provider":`...), e.Provider)
	b = appendJSONString(append(b, `,"rate_card":`...), e.RateCard)
	b = strconv.AppendInt(append(b, `,"rate_card_version":`...), int64(e.RateCardVersion), 10)
	b = appendJSONString(append(b, `,"currency":`...), e.Currency)
	b = append(appendMicros(append(b, `,"unit_price":"`...), e.UnitPriceMicros), '"')
	b = strconv.AppendInt(append(b, `,"unit_price_micros":`...), e.UnitPriceMicros, 10)
	b = strconv.AppendInt(append(b, `,"seconds":`...), e.Seconds, 10)
	b = append(appendMinor(append(b, `,"amount":"`...), e.AmountMicros, e.Currency), '"')
	b = strconv.AppendInt(append(b, `,"amount_micros":`...), e.AmountMicros, 10)
	b = append(appendExportTime(append(b, `,"started_at":"`...), e.StartedAt), '"')
	b = append(appendExportTime(append(b, `,"ended_at":"`...), e.EndedAt), '"')
	b = append(appendExportTime(append(b, `,"terminated_at":"`...), e.TerminatedAt), '"')
	b = appendJSONString(append(b, `,"termination_reason":`...), e.TerminationReason)
	b = appendJSONString(append(b, `,"corrects":`...), e.Corrects)
	b = strconv.AppendInt(append(b, `,"egress_bytes_out":`...), e.EgressBytesOut, 10)
	b = strconv.AppendInt(append(b, `,"egress_bytes_in":`...), e.EgressBytesIn, 10)
	b = appendJSONString(append(b, `,"reason":`...), e.Reason)
	b = appendJSONString(append(b, `,"actor":`...), e.Actor)
	return append(b, '}', '\n')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as encoding/json writes a string without
// HTML escaping: quotes, backslashes and control characters escaped (\b,
// \f, \n, \r, \t short), invalid UTF-8 as \ufffd, U+2028 and U+2029
// escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(append(b, s[start:i]...), `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(append(b, s[start:i]...), '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(append(b, s[start:]...), '"')
}

// appendExportTime appends exportTime(t). Years of four digits, every
// ledger time, are written digit by digit: AppendFormat walks its layout
// for each of the three times of every row, a third of a row's cost.
func appendExportTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, exportLayout)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / 1e6
	return append(b,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
}

// appendMinor appends FormatMinor(micros, currency).
func appendMinor(b []byte, micros int64, currency string) []byte {
	d := MinorUnits(currency)
	step := int64(1)
	for range 6 - d {
		step *= 10
	}
	neg := micros < 0
	// Work on the magnitude as uint64, so math.MinInt64 has one.
	m := uint64(micros)
	if neg {
		m = -m
	}
	units := m / uint64(step)
	if rem := m % uint64(step); rem*2 >= uint64(step) {
		units++
	}
	return appendFixedPoint(b, neg && units != 0, units, d)
}

// appendMicros appends FormatMicros(micros).
func appendMicros(b []byte, micros int64) []byte {
	m := uint64(micros)
	if micros < 0 {
		m = -m
	}
	return appendFixedPoint(b, micros < 0, m, 6)
}

// appendFixedPoint appends v / 10^d with d fractional digits.
func appendFixedPoint(b []byte, neg bool, v uint64, d int) []byte {
	if neg {
		b = append(b, '-')
	}
	var digits [24]byte
	s := strconv.AppendUint(digits[:0], v, 10)
	if d == 0 {
		return append(b, s...)
	}
	if len(s) <= d {
		b = append(b, '0', '.')
		for range d - len(s) {
			b = append(b, '0')
		}
		return append(b, s...)
	}
	b = append(b, s[:len(s)-d]...)
	return append(append(b, '.'), s[len(s)-d:]...)
}
