package console

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// The usage charts are bar charts drawn on the server as inline SVG: no
// script and no charting library, so the console works under a CSP that
// allows no script at all, and its binary embeds nothing from npm.

// chart is one bar chart of a value per day of a month.
type chart struct {
	Title  string
	Metric string // "seconds" or "amount"
	Unit   string // "s" or a currency
	Width  int
	Height int
	Bars   []bar
	Total  string
	Wide   bool // bars of named groups (sizes), labelled under the bars
}

// bar is one day of a chart, with its SVG geometry.
type bar struct {
	Day        string // YYYY-MM-DD
	Value      int64  // seconds, or micro-units
	Label      string // the value as shown
	X, Y, W, H int
}

// Chart geometry, in SVG user units.
const (
	chartHeight = 120
	barWidth    = 14
	barGap      = 4
)

// dayCharts draws the seconds per day of groups (a summary grouped by day)
// in [from, to), and the amount per day for each currency.
func dayCharts(title string, groups []adminapi.SummaryGroup, from, to time.Time) []chart {
	var days []string
	for d := from; d.Before(to); d = d.AddDate(0, 0, 1) {
		days = append(days, d.Format("2006-01-02"))
	}
	secs := map[string]int64{}
	amounts := map[string]map[string]int64{} // currency → day → micros
	var currencies []string
	for _, g := range groups {
		secs[g.Key] += g.Seconds
		if amounts[g.Currency] == nil {
			amounts[g.Currency] = map[string]int64{}
			currencies = append(currencies, g.Currency)
		}
		amounts[g.Currency][g.Key] += g.AmountMicros
	}
	slices.Sort(currencies)
	var total int64
	for _, v := range secs {
		total += v
	}
	out := []chart{draw(title+": metered seconds per day", "seconds", "s", days, secs, strconv.FormatInt(total, 10)+" s",
		func(v int64) string { return strconv.FormatInt(v, 10) + " s" })}
	for _, cur := range currencies {
		var sum int64
		for _, v := range amounts[cur] {
			sum += v
		}
		out = append(out, draw(title+": amount per day ("+cur+")", "amount", cur, days, amounts[cur], billing.FormatMinor(sum, cur)+" "+cur,
			func(v int64) string { return billing.FormatMinor(v, cur) + " " + cur }))
	}
	return out
}

// sizeCharts draws the seconds and, per currency, the amounts of groups
// (a summary grouped by size), one bar per size.
func sizeCharts(groups []adminapi.SummaryGroup) []chart {
	var sizes []string
	secs := map[string]int64{}
	amounts := map[string]map[string]int64{}
	var currencies []string
	for _, g := range groups {
		if !slices.Contains(sizes, g.Key) {
			sizes = append(sizes, g.Key)
		}
		secs[g.Key] += g.Seconds
		if amounts[g.Currency] == nil {
			amounts[g.Currency] = map[string]int64{}
			currencies = append(currencies, g.Currency)
		}
		amounts[g.Currency][g.Key] += g.AmountMicros
	}
	if len(sizes) == 0 {
		return nil
	}
	slices.Sort(currencies)
	out := []chart{draw("metered seconds per size", "seconds", "s", sizes, secs, "",
		func(v int64) string { return strconv.FormatInt(v, 10) + " s" })}
	for _, cur := range currencies {
		out = append(out, draw("amount per size ("+cur+")", "amount", cur, sizes, amounts[cur], "",
			func(v int64) string { return billing.FormatMinor(v, cur) + " " + cur }))
	}
	for i := range out {
		out[i].Wide = true
	}
	return out
}

func draw(title, metric, unit string, days []string, values map[string]int64, total string, label func(int64) string) chart {
	var top int64
	for _, v := range values {
		top = max(top, v)
	}
	step := barWidth + barGap
	if len(days) <= 8 {
		step = 64 // named groups (sizes): room for their labels
	}
	c := chart{Title: title, Metric: metric, Unit: unit, Width: len(days) * step, Height: chartHeight + 16, Total: total}
	for i, d := range days {
		v := values[d]
		h := 0
		if top > 0 && v > 0 {
			h = max(1, int(v*chartHeight/top))
		}
		c.Bars = append(c.Bars, bar{Day: d, Value: v, Label: fmt.Sprintf("%s: %s", d, label(v)),
			X: i * step, Y: chartHeight - h, W: barWidth, H: h})
	}
	return c
}
