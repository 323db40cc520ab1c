package console

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// The usage charts are drawn on the server as inline SVG: no script and
// no charting library, so the console works under a CSP that allows no
// script at all, and its binary embeds nothing from npm. Time series
// have axes with tick labels and units, a legend with each series' total,
// and the chart's total; a chart by account draws the top topAccounts
// accounts and sums the rest under "others", and says so.

// topAccounts is how many accounts a chart by account draws as series.
const topAccounts = 8

// palette colours the series; others is grey, the total dashed.
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

const othersColor = "#8a8f98"

// chart is one bar chart of a value per named group (sizes).
type chart struct {
	Title  string
	Metric string // "seconds" or "amount"
	Unit   string // "s" or a currency
	Width  int
	Height int
	Bars   []bar
	Total  string
	Wide   bool // bars labelled under the bars
}

// bar is one group of a bar chart, with its SVG geometry.
type bar struct {
	Day        string // the group's key (data-day, as the page's tests read it)
	Value      int64  // seconds, or micro-units
	Label      string // the value as shown
	X, Y, W, H int
}

// Bar chart geometry, in SVG user units.
const (
	chartHeight = 120
	barWidth    = 14
)

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
	out := []chart{drawBars("metered seconds per size", "seconds", "s", sizes, secs, seconds)}
	for _, cur := range currencies {
		out = append(out, drawBars("amount per size ("+cur+")", "amount", cur, sizes, amounts[cur], money(cur)))
	}
	return out
}

func drawBars(title, metric, unit string, keys []string, values map[string]int64, label func(int64) string) chart {
	var top, total int64
	for _, v := range values {
		top = max(top, v)
		total += v
	}
	const step = 64 // room for the groups' labels
	c := chart{Title: title, Metric: metric, Unit: unit, Width: len(keys) * step, Height: chartHeight + 16, Total: label(total), Wide: true}
	for i, k := range keys {
		v := values[k]
		h := 0
		if top > 0 && v > 0 {
			h = max(1, int(v*chartHeight/top))
		}
		c.Bars = append(c.Bars, bar{Day: k, Value: v, Label: fmt.Sprintf("%s: %s", k, label(v)),
			X: i * step, Y: chartHeight - h, W: barWidth, H: h})
	}
	return c
}

func seconds(v int64) string { return strconv.FormatInt(v, 10) + " s" }

func money(cur string) func(int64) string {
	return func(v int64) string { return billing.FormatMinor(v, cur) + " " + cur }
}

// timeChart is a time series chart: a value per day for a few series,
// and the total of them all.
type timeChart struct {
	Title  string
	Metric string // "seconds" or "amount"
	Unit   string // "s" or a currency
	Axis   string // the y axis' title, with its unit
	Width  int
	Height int
	Left   int // the plot's left edge
	Top    int // the plot's top edge
	Plot   int // the plot's height
	Bottom int // the plot's bottom edge (y of the x axis)
	Right  int
	YTicks []tick
	XTicks []tick
	Series []series
	Days   []day
	Total  string
	// Shown of Of are the series drawn, of all there are; Others is
	// the name the rest are summed under ("" when none is left out).
	Shown, Of   int
	What        string // what a series is: "accounts", "sizes"
	Others      string
	TotalPoints string // the polyline of the total
	XLabel      string
	Note        string // "8 of 50 accounts drawn; …"
}

// tick is one labelled tick of an axis.
type tick struct {
	Pos   int
	Label string
}

// series is one line of a time series chart.
type series struct {
	Key    string
	Name   string
	Color  string
	Total  string
	Points string // SVG polyline points
}

// day is one day's column: its hover area with the day's total.
type day struct {
	Day   string // YYYY-MM-DD
	Value int64  // the total of every series
	Label string
	X, W  int
}

// Time series geometry, in SVG user units.
const (
	tsWidth  = 760
	tsHeight = 240
	tsLeft   = 84
	tsRight  = 12
	tsTop    = 24 // room for the y axis' title above the plot
	tsBottom = 34
)

// timeSeries draws the days' values of the top series (in their order:
// key → day → value) with the total per day of all of them, of which the
// top are shown of of; what is left of the total is drawn as "others".
func timeSeries(title, metric, unit, what string, days []string, top []string, values map[string]map[string]int64,
	total map[string]int64, of int, name func(string) string, label func(int64) string) timeChart {
	c := timeChart{Title: title, Metric: metric, Unit: unit, Width: tsWidth, Height: tsHeight,
		Left: tsLeft, Top: tsTop, Bottom: tsHeight - tsBottom, Right: tsWidth - tsRight, Shown: len(top), Of: of, What: what}
	c.Axis = "amount (" + unit + ")"
	if metric == "seconds" {
		c.Axis = "metered seconds (s)"
	}
	var peak, sum int64
	for _, d := range days {
		peak = max(peak, total[d])
		sum += total[d]
	}
	c.Total = label(sum)
	step := niceStep(peak)
	yMax := step * 4
	plotH := c.Bottom - tsTop
	c.Plot = plotH
	plotW := c.Right - c.Left
	x := func(i int) int {
		if len(days) < 2 {
			return c.Left + plotW/2
		}
		return c.Left + i*plotW/(len(days)-1)
	}
	y := func(v int64) int { return c.Bottom - int(v*int64(plotH)/yMax) }
	for i := int64(0); i <= 4; i++ {
		c.YTicks = append(c.YTicks, tick{Pos: y(i * step), Label: label(i * step)})
	}
	every := max(1, (len(days)+7)/8)
	colW := plotW / max(1, len(days))
	for i, d := range days {
		if i%every == 0 || i == len(days)-1 {
			c.XTicks = append(c.XTicks, tick{Pos: x(i), Label: d[5:]})
		}
		c.Days = append(c.Days, day{Day: d, Value: total[d], Label: d + ": " + label(total[d]), X: x(i) - colW/2, W: max(colW, 1)})
	}
	if len(days) > 0 {
		c.XLabel = "day (UTC), " + days[0][:7]
	}
	line := func(v func(d string) int64) string {
		var b strings.Builder
		for i, d := range days {
			fmt.Fprintf(&b, "%d,%d ", x(i), y(v(d)))
		}
		return strings.TrimSpace(b.String())
	}
	rest := map[string]int64{}
	for d, v := range total {
		rest[d] = v
	}
	for i, k := range top {
		var t int64
		for _, d := range days {
			t += values[k][d]
			rest[d] -= values[k][d]
		}
		c.Series = append(c.Series, series{Key: k, Name: name(k), Color: palette[i%len(palette)], Total: label(t),
			Points: line(func(d string) int64 { return values[k][d] })})
	}
	if of > len(top) {
		var t int64
		for _, d := range days {
			t += rest[d]
		}
		c.Others = fmt.Sprintf("others (%d %s)", of-len(top), what)
		c.Series = append(c.Series, series{Key: "others", Name: c.Others, Color: othersColor, Total: label(t),
			Points: line(func(d string) int64 { return max(rest[d], 0) })})
	}
	c.TotalPoints = line(func(d string) int64 { return total[d] })
	c.Note = fmt.Sprintf("%d of %d %s drawn as their own series", len(top), of, what)
	if c.Others != "" {
		c.Note += fmt.Sprintf("; the other %d are summed under \u201cothers\u201d", of-len(top))
	}
	return c
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten such
// that four steps reach at least peak (and 1 for nothing).
func niceStep(peak int64) int64 {
	need := max((peak+3)/4, 1)
	for mag := int64(1); ; mag *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*mag >= need {
				return m * mag
			}
		}
	}
}

// daysOf lists the UTC days of [from, to) as YYYY-MM-DD.
func daysOf(from, to time.Time) []string {
	var out []string
	for d := from; d.Before(to); d = d.AddDate(0, 0, 1) {
		out = append(out, d.Format("2006-01-02"))
	}
	return out
}

// ranked returns the keys of groups by value, most first (then by key),
// with value > 0 only.
func ranked(groups []adminapi.SummaryGroup, value func(adminapi.SummaryGroup) int64) []string {
	sum := map[string]int64{}
	for _, g := range groups {
		sum[g.Key] += value(g)
	}
	var out []string
	for k, v := range sum {
		if v > 0 {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Or(cmp.Compare(sum[b], sum[a]), cmp.Compare(a, b)) })
	return out
}
