package console

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"

	"github.com/sandgate/sandgate/adminapi"
)

type usageData struct {
	Month, Prev, Next string
	ByAccount         []adminapi.SummaryGroup
	BySize            []adminapi.SummaryGroup
	Names             map[string]string       // account id → name
	Accounts          []adminapi.SummaryGroup // ByAccount's rows shown: the busiest first
	MoreAccounts      int                     // accounts left out of Accounts
	AllAccounts       string                  // the page with every account's rows
	Days              []timeChart             // by account: seconds, then the amount per currency
	SizeCharts        []chart                 // per size: seconds, then the amount per currency
	SizeDays          []timeChart             // by size: seconds, then the amount per currency
	Pool              []adminapi.PoolLine     // the warm pools' own time and cost, in no account's rows
	CSV               string
}

// usage is the usage page of one month: metered seconds and, per
// currency, amounts per day by account (the top topAccounts, the rest as
// others) and by size, totals per account and per size, the warm pools'
// own time and cost, and the month's CSV export. Its height does not grow with the number of accounts.
func (c *Console) usage(w http.ResponseWriter, r *http.Request, s *session) {
	m, from, to, err := c.month(r)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	d := usageData{Month: m, Prev: from.AddDate(0, -1, 0).Format("2006-01"), Next: to.Format("2006-01"),
		CSV: Prefix + "usage.csv?month=" + m, Names: map[string]string{}}
	days := daysOf(from, to)
	// dayValues reads a summary by day of f.
	dayValues := func(f url.Values) (perDay, error) {
		gs, err := c.summaryOf(r, s, "day", from, to, f)
		out := perDay{secs: map[string]int64{}, amounts: map[string]map[string]int64{}}
		for _, g := range gs {
			out.secs[g.Key] += g.Seconds
			if out.amounts[g.Currency] == nil {
				out.amounts[g.Currency] = map[string]int64{}
			}
			out.amounts[g.Currency][g.Key] += g.AmountMicros
		}
		return out, err
	}
	all, err := dayValues(nil)
	if err == nil {
		var sum adminapi.UsageSummary
		sum, err = c.summary(r, s, "account", from, to, nil)
		d.ByAccount, d.Pool = sum.Groups, sum.Pool
	}
	if err == nil {
		d.BySize, err = c.summaryOf(r, s, "size", from, to, nil)
	}
	var accounts []adminapi.Account
	if err == nil {
		err = c.call(r, s.token, http.MethodGet, "/accounts", nil, &accounts)
	}
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	for _, a := range accounts {
		d.Names[a.ID] = a.Name
	}
	limit := tableAccounts
	if r.URL.Query().Get("accounts") == "all" {
		limit = -1
	}
	d.Accounts, d.MoreAccounts = busiest(d.ByAccount, limit)
	d.AllAccounts = Prefix + "usage?month=" + m + "&accounts=all#by-account"
	name := func(id string) string {
		if n := d.Names[id]; n != "" {
			return n
		}
		return id
	}
	var currencies []string
	for cur := range all.amounts {
		currencies = append(currencies, cur)
	}
	slices.Sort(currencies)

	// Each account drawn is read once, by day, whatever chart draws it.
	perAccount := map[string]perDay{}
	read := func(keys []string, f func(string) url.Values, into map[string]perDay) error {
		for _, k := range keys {
			if _, ok := into[k]; ok {
				continue
			}
			v, err := dayValues(f(k))
			if err != nil {
				return err
			}
			into[k] = v
		}
		return nil
	}
	byAccount := func(k string) url.Values { return url.Values{"account": {k}} }
	secsRank := ranked(d.ByAccount, func(g adminapi.SummaryGroup) int64 { return g.Seconds })
	top := secsRank[:min(len(secsRank), topAccounts)]
	if err := read(top, byAccount, perAccount); err != nil {
		c.fail(w, r, s, err)
		return
	}
	d.Days = append(d.Days, timeSeries("metered seconds per day by account", "seconds", "s", "accounts", days, top,
		secondsOf(perAccount), all.secs, len(secsRank), name, seconds))
	for _, cur := range currencies {
		rank := ranked(d.ByAccount, func(g adminapi.SummaryGroup) int64 {
			if g.Currency != cur {
				return 0
			}
			return g.AmountMicros
		})
		top := rank[:min(len(rank), topAccounts)]
		if err := read(top, byAccount, perAccount); err != nil {
			c.fail(w, r, s, err)
			return
		}
		d.Days = append(d.Days, timeSeries("amount per day by account ("+cur+")", "amount", cur, "accounts", days, top,
			amountsOf(perAccount, cur), all.amounts[cur], len(rank), name, money(cur)))
	}

	d.SizeCharts = sizeCharts(d.BySize)
	perSize := map[string]perDay{}
	sizes := ranked(d.BySize, func(g adminapi.SummaryGroup) int64 { return g.Seconds + g.AmountMicros })
	if err := read(sizes, func(k string) url.Values { return url.Values{"size": {k}} }, perSize); err != nil {
		c.fail(w, r, s, err)
		return
	}
	ident := func(k string) string { return k }
	if len(sizes) > 0 {
		d.SizeDays = append(d.SizeDays, timeSeries("metered seconds per day by size", "seconds", "s", "sizes", days, sizes,
			secondsOf(perSize), all.secs, len(sizes), ident, seconds))
		for _, cur := range currencies {
			d.SizeDays = append(d.SizeDays, timeSeries("amount per day by size ("+cur+")", "amount", cur, "sizes", days, sizes,
				amountsOf(perSize, cur), all.amounts[cur], len(sizes), ident, money(cur)))
		}
	}
	c.renderView(w, s, http.StatusOK, "usage", view{Title: "usage", Data: d})
}

// perDay is a summary by day: seconds, and amounts per currency.
type perDay struct {
	secs    map[string]int64            // day → seconds
	amounts map[string]map[string]int64 // currency → day → micros
}

// secondsOf returns the seconds by day of each key of m.
func secondsOf(m map[string]perDay) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for k, v := range m {
		out[k] = v.secs
	}
	return out
}

// amountsOf returns the amounts in cur by day of each key of m.
func amountsOf(m map[string]perDay, cur string) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for k, v := range m {
		out[k] = v.amounts[cur]
	}
	return out
}

// tableAccounts is how many accounts the usage page's per-account table
// lists before it links to the whole list.
const tableAccounts = 10

// busiest orders groups (one per account and currency) by their
// account's metered seconds, most first, and keeps the rows of the first
// limit accounts (every row when limit < 0). It returns how many
// accounts it left out.
func busiest(groups []adminapi.SummaryGroup, limit int) ([]adminapi.SummaryGroup, int) {
	secs := map[string]int64{}
	for _, g := range groups {
		secs[g.Key] += g.Seconds
	}
	out := slices.Clone(groups)
	slices.SortFunc(out, func(a, b adminapi.SummaryGroup) int {
		return cmp.Or(cmp.Compare(secs[b.Key], secs[a.Key]), cmp.Compare(a.Key, b.Key), cmp.Compare(a.Currency, b.Currency))
	})
	if limit < 0 || len(secs) <= limit {
		return out, 0
	}
	n, shown := 0, 0
	for i, g := range out {
		if i == 0 || g.Key != out[i-1].Key {
			if shown == limit {
				break
			}
			shown++
		}
		n++
	}
	return out[:n], len(secs) - shown
}
