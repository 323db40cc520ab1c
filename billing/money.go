package billing

import (
	"errors"
	"fmt"
	"golang.org/x/text/currency"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Money is an int64 count of micro-units of one currency: 1 000 000 is
// 1.00 USD on a USD account. Floats never touch it.
//
// The rounding rules, applied here and nowhere else:
//
//   - Metered time is whole seconds, rounded up: [MeteredSeconds].
//   - A price is micro-units per second, so an amount is
//     unit price × seconds, exact: [Amount] never rounds (it refuses an
//     overflow instead).
//   - A worst case is unit price × the workspace's whole lifetime in
//     seconds, rounded up like metered time: [WorstCase].
//   - Decimal input has at most 6 fractional digits; more is refused, never
//     rounded: [ParseAmount]; printed by [FormatAmount].
const MicrosPerUnit = 1_000_000

// ErrOverflow is returned when an amount does not fit in int64 micro-units.
var ErrOverflow = errors.New("billing: amount overflows int64 micro-units")

// ParseAmount parses a decimal amount of currency units ("25", "25.00",
// "0.000100", "-3.5") into micro-units. It refuses more than 6 fractional
// digits, exponents, and anything that is not a plain decimal.
func ParseAmount(s string) (int64, error) {
	orig := s
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, dot := strings.Cut(s, ".")
	if len(frac) > 6 || !digits(whole) || dot && !digits(frac) {
		return 0, fmt.Errorf("amount %q: want a decimal with at most 6 fractional digits", orig)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > math.MaxInt64/MicrosPerUnit-1 {
		return 0, fmt.Errorf("amount %q: %w", orig, ErrOverflow)
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	v := w*MicrosPerUnit + f
	if neg {
		v = -v
	}
	return v, nil
}

func digits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// FormatAmount writes micro-units as a decimal of currency units with at least
// two fractional digits and no trailing zeros beyond them: 25000000 →
// "25.00", 100 → "0.0001", -1500000 → "-1.50".
func FormatAmount(micros int64) string {
	sign := ""
	u := uint64(micros)
	if micros < 0 {
		sign, u = "-", uint64(-micros) // -MinInt64 wraps to its magnitude as uint64
	}
	frac := fmt.Sprintf("%06d", u%MicrosPerUnit)
	frac = strings.TrimRight(frac, "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return sign + strconv.FormatUint(u/MicrosPerUnit, 10) + "." + frac
}

// Amount is unitMicros (per second) × seconds, exact.
func Amount(unitMicros, seconds int64) (int64, error) {
	if unitMicros < 0 || seconds < 0 {
		return 0, fmt.Errorf("billing: negative price or seconds")
	}
	hi, lo := bits.Mul64(uint64(unitMicros), uint64(seconds))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, ErrOverflow
	}
	return int64(lo), nil
}

// MeteredSeconds is the whole seconds from start to end, rounded up; 0 when
// the workspace never started or end is not after start.
func MeteredSeconds(start, end time.Time) int64 {
	if start.IsZero() || !end.After(start) {
		return 0
	}
	d := end.Sub(start)
	return int64((d + time.Second - 1) / time.Second)
}

// WorstCase is what a workspace admitted at created and ending at expires
// can cost at unitMicros per second.
func WorstCase(unitMicros int64, created, expires time.Time) (int64, error) {
	return Amount(unitMicros, MeteredSeconds(created, expires))
}

// ValidCurrency reports whether c is an ISO 4217 currency code, in
// upper case (USD, EUR, JPY; XXX, "no currency", included), as
// golang.org/x/text/currency knows them. "ABC" and "usd" are not.
func ValidCurrency(c string) bool {
	if len(c) != 3 || strings.ToUpper(c) != c {
		return false
	}
	_, err := currency.ParseISO(c)
	return err == nil
}

// NoCurrency is ISO 4217's "no currency", the currency of an account never
// configured for billing.
const NoCurrency = "XXX"
