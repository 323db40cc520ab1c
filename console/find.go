package console

import (
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
)

// Finding rows in the console's tables: column headers are plain links
// that sort by their column (a second click reverses it), and next and
// previous links page with the operator API's opaque cursors. Cursors
// only go forward, so a page's link carries the cursors of the pages
// before it (trail), and "previous" pops the last of them.

// sortLink is one sortable column header.
type sortLink struct {
	Href string
	Mark string // ▲ or ▼ on the column the table is sorted by
}

// sortLinks returns the header links of cols for the table at path with
// the filters f (whose "sort" is the current sort); a link starts again
// at the first page.
func sortLinks(path string, f url.Values, cols ...string) map[string]sortLink {
	cur := f.Get("sort")
	out := make(map[string]sortLink, len(cols))
	for _, col := range cols {
		q := cloneValues(f)
		l := sortLink{}
		switch cur {
		case col:
			q.Set("sort", "-"+col)
			l.Mark = "▲"
		case "-" + col:
			q.Set("sort", col)
			l.Mark = "▼"
		default:
			q.Set("sort", col)
		}
		l.Href = path + "?" + q.Encode()
		out[col] = l
	}
	return out
}

// pager holds a table's previous and next page links ("" when none).
type pager struct {
	Prev, Next string
}

// trailSep joins the cursors of a trail; cursors are base64url, without it.
const trailSep = "."

// pagesOf returns the pager of the page of path with filters f that
// started at the request's cursor, when the API's next cursor is next.
func pagesOf(path string, f url.Values, r *http.Request, next string) pager {
	q := r.URL.Query()
	cur := q.Get("cursor")
	var p pager
	if next != "" {
		nq := cloneValues(f)
		nq.Set("cursor", next)
		if _, ok := q["trail"]; ok {
			nq.Set("trail", q.Get("trail")+trailSep+cur)
		} else {
			nq.Set("trail", cur)
		}
		p.Next = path + "?" + nq.Encode()
	}
	if trail, ok := q["trail"]; ok {
		pq := cloneValues(f)
		t := trail[0]
		if i := strings.LastIndex(t, trailSep); i >= 0 {
			pq.Set("trail", t[:i])
			t = t[i+len(trailSep):]
		}
		if t != "" {
			pq.Set("cursor", t)
		}
		p.Prev = path + "?" + pq.Encode()
	}
	return p
}

// pageParams are the query of one page of an operator API list: the
// console's filters f, the request's cursor, and limit (unless f has one).
func pageParams(f url.Values, r *http.Request, limit string) url.Values {
	q := cloneValues(f)
	if q.Get("limit") == "" {
		q.Set("limit", limit)
	}
	if cur := r.URL.Query().Get("cursor"); cur != "" {
		q.Set("cursor", cur)
	}
	return q
}

// filters returns the request's non-empty query parameters among keys.
func filters(r *http.Request, keys ...string) url.Values {
	f := url.Values{}
	for _, k := range keys {
		if v := strings.TrimSpace(r.URL.Query().Get(k)); v != "" {
			f.Set(k, v)
		}
	}
	return f
}

// nameBook names accounts and instances by id, for the pages that show
// them by name with the id on hover.
type nameBook struct {
	Accounts  map[string]string
	Instances map[string]string
}

// names reads the names the session may see: every account's, and
// every instance's for a role that may list instances. Names are a
// courtesy: a page whose names cannot be read shows ids.
func (c *Console) names(r *http.Request, s *session) nameBook {
	b := nameBook{Accounts: map[string]string{}, Instances: map[string]string{}}
	if readNames(c, r, s, "/accounts", b.Accounts, func(a adminapi.Account) (string, string) { return a.ID, a.Name }) && s.may(opsRoles...) {
		readNames(c, r, s, "/instances", b.Instances, func(in adminapi.Instance) (string, string) { return in.ID, in.Name })
	}
	return b
}

// readNames reads the list at path into names, by id as idName gives
// them, and reports whether it could.
func readNames[T any](c *Console, r *http.Request, s *session, path string, names map[string]string, idName func(T) (string, string)) bool {
	var rows []T
	if err := c.call(r, s.token, http.MethodGet, path, nil, &rows); err != nil {
		c.log.Warn("console names not read", slog.String("list", path), slog.Any(sandgate.KeyError, err))
		return false
	}
	for _, row := range rows {
		id, name := idName(row)
		names[id] = name
	}
	return true
}

// Target is an audit target ("account:acct_x", "instance:inst_y", …)
// with the account's or instance's name in place of its id, when known.
func (b nameBook) Target(t string) string {
	kind, id, ok := strings.Cut(t, ":")
	if !ok {
		return t
	}
	switch kind {
	case "account":
		if n := b.Accounts[id]; n != "" {
			return kind + ":" + n
		}
	case "instance":
		if n := b.Instances[id]; n != "" {
			return kind + ":" + n
		}
	}
	return t
}
