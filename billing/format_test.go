package billing_test

import (
	"testing"

	"github.com/sandgate/sandgate/billing"
)

func TestFormatExact(t *testing.T) {
	tests := []struct {
		micros   int64
		currency string
		want     string
	}{
		{25_000_000, "USD", "25.00"},
		{100, "USD", "0.0001"},
		{99_999_920, "USD", "99.99992"},
		{-1_500_000, "EUR", "-1.50"},
		{1_500_000_000, "JPY", "1500"},
		{1_500_000, "JPY", "1.5"},
		{1_000_000, "KWD", "1.000"},
		{12_345_678, "CLF", "12.345678"},
		{0, "XXX", "0.00"},
	}
	for _, tt := range tests {
		if got := billing.FormatExact(tt.micros, tt.currency); got != tt.want {
			t.Errorf("FormatExact(%d, %q) = %q; want %q", tt.micros, tt.currency, got, tt.want)
		}
	}
}

func TestValidCurrency(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want bool
	}{{"USD", true}, {"EUR", true}, {"JPY", true}, {"KWD", true}, {"XXX", true}, {"CHF", true},
		{"ABC", false}, {"usd", false}, {"US", false}, {"USDX", false}, {"", false}, {"U$D", false}} {
		if got := billing.ValidCurrency(tt.in); got != tt.want {
			t.Errorf("ValidCurrency(%q) = %v; want %v", tt.in, got, tt.want)
		}
	}
}
