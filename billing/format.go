package billing

import "strings"

// FormatExact writes micro-units of currency exactly, with at least the
// currency's minor units of fraction (MinorUnits) and no trailing zeros
// beyond them: FormatExact(25_000_000, "USD") = "25.00",
// FormatExact(100, "USD") = "0.0001", FormatExact(1_500_000_000, "JPY") =
// "1500", FormatExact(1_000_000, "KWD") = "1.000". It is how balances,
// holds and credits are printed everywhere (the operator API, the CLI,
// the console): exact, unlike FormatMinor, which rounds usage amounts.
func FormatExact(micros int64, currency string) string {
	s := FormatAmount(micros) // at least two fraction digits, exact
	whole, frac, _ := strings.Cut(s, ".")
	frac = strings.TrimRight(frac, "0")
	for d := MinorUnits(currency); len(frac) < d; {
		frac += "0"
	}
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}
