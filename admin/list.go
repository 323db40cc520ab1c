package admin

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

// Finding rows: every list of the operator API (accounts, instances,
// workspaces) takes q, a case-insensitive prefix of a name, id or label;
// sort, a column, descending with a leading "-"; limit; and cursor, the
// previous page's next cursor. Rows are ordered by the column's key, then
// by id, and a cursor names the last row of its page by both, so rows
// added or removed during a walk never shift it.

// listQuery is the q, sort, limit and cursor of one list request.
type listQuery struct {
	q     string // lower-cased; "" matches every row
	sort  string // as requested, "-" included
	col   string // the column
	desc  bool
	limit int // 0: every row
	after *cursorPos
}

// cursorPos is the last row of the previous page, under the sort it was
// listed by.
type cursorPos struct {
	Sort string `json:"s"`
	Key  string `json:"k"`
	ID   string `json:"i"`
}

// parseList reads the list parameters; cols are the sortable columns,
// def the default sort, defLimit the limit when none is given (0: all).
func parseList(c echo.Context, cols []string, def string, defLimit int) (listQuery, error) {
	q := c.QueryParams()
	lq := listQuery{q: strings.ToLower(strings.TrimSpace(q.Get("q"))), sort: cmp.Or(q.Get("sort"), def), limit: defLimit}
	lq.col, lq.desc = strings.TrimPrefix(lq.sort, "-"), strings.HasPrefix(lq.sort, "-")
	if !slices.Contains(cols, lq.col) {
		return lq, invalid("sort must be one of " + strings.Join(cols, ", ") + ", each descending with a leading -")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return lq, invalid(fmt.Sprintf("limit must be 1 to %d", maxListLimit))
		}
		lq.limit = n
	}
	if v := q.Get("cursor"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		var pos cursorPos
		if err != nil || json.Unmarshal(b, &pos) != nil || pos.ID == "" {
			return lq, invalid("cursor is not one this API returned")
		}
		if pos.Sort != lq.sort {
			return lq, invalid("cursor was returned for sort " + pos.Sort + "; send the same sort with it")
		}
		lq.after = &pos
	}
	return lq, nil
}

// maxListLimit bounds one page.
const maxListLimit = 500

// matches reports whether one of fields starts with the query's q.
func (lq listQuery) matches(fields ...string) bool {
	if lq.q == "" {
		return true
	}
	for _, f := range fields {
		if f != "" && strings.HasPrefix(strings.ToLower(f), lq.q) {
			return true
		}
	}
	return false
}

// sortKey is a row's key under a column: a string whose order is the
// column's order (names lower-cased, times as fixed-width numbers).
type sortKey[T any] func(T) string

// page sorts rows by the query's column (key by its name) then by id,
// drops those up to the cursor, and cuts the rest to the limit. It
// returns the page and the cursor of the next one ("" when it is the last).
func page[T any](lq listQuery, rows []T, keys map[string]sortKey[T], id func(T) string) ([]T, string) {
	key := keys[lq.col]
	order := func(ka, ia, kb, ib string) int {
		c := cmp.Or(cmp.Compare(ka, kb), cmp.Compare(ia, ib))
		if lq.desc {
			return -c
		}
		return c
	}
	type keyed struct {
		k, id string
		v     T
	}
	ks := make([]keyed, 0, len(rows))
	for _, r := range rows {
		k := keyed{key(r), id(r), r}
		if lq.after != nil && order(k.k, k.id, lq.after.Key, lq.after.ID) <= 0 {
			continue
		}
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b keyed) int { return order(a.k, a.id, b.k, b.id) })
	next := ""
	if lq.limit > 0 && len(ks) > lq.limit {
		ks = ks[:lq.limit]
		last := ks[len(ks)-1]
		b, _ := json.Marshal(cursorPos{Sort: lq.sort, Key: last.k, ID: last.id})
		next = base64.RawURLEncoding.EncodeToString(b)
	}
	out := make([]T, len(ks))
	for i, k := range ks {
		out[i] = k.v
	}
	return out, next
}

// timeKey is a sort key of t: nanoseconds since 1970, fixed width.
func timeKey(ns int64) string { return fmt.Sprintf("%020d", max(ns, 0)) }

// accountByRef returns the id of the account ref names: its id, or its
// name (compared by [store.AccountNameKey]). Returns NotFound.
func (v *service) accountByRef(ctx context.Context, ref string) (string, error) {
	_, err := v.db.Account(ctx, ref)
	if err == nil {
		return ref, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return "", storeFailed(err)
	}
	id, err := v.db.AccountIDByName(ctx, ref)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return "", storeFailed(err)
	}
	// Accounts created before names were claimed hold no claim.
	as, err := v.db.Accounts(ctx)
	if err != nil {
		return "", storeFailed(err)
	}
	for _, a := range as {
		if store.AccountNameKey(a.Name) == store.AccountNameKey(ref) {
			return a.ID, nil
		}
	}
	return "", protocol.E(protocol.NotFound, "no such account")
}

// instanceByRef returns the instance ref names: its id, or its name
// among acct's instances (every account's when acct is ""). A name two
// instances share is refused: the caller gives an id or an account.
// Returns NotFound.
func (v *service) instanceByRef(ctx context.Context, acct, ref string) (sandgate.Instance, error) {
	in, err := v.db.Instance(ctx, ref)
	if err == nil {
		return in, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return in, storeFailed(err)
	}
	accts, err := v.accountIDs(ctx, acct)
	if err != nil {
		return in, err
	}
	ins, err := v.db.InstancesOf(ctx, accts)
	if err != nil {
		return in, storeFailed(err)
	}
	var hits []sandgate.Instance
	for _, in := range ins {
		if strings.EqualFold(strings.TrimSpace(in.Name), strings.TrimSpace(ref)) {
			hits = append(hits, in)
		}
	}
	switch len(hits) {
	case 0:
		return in, protocol.E(protocol.NotFound, "no such instance")
	case 1:
		return hits[0], nil
	}
	return in, invalid(fmt.Sprintf("instance name %q is shared by %d instances; give an instance id, or an account with it", ref, len(hits)))
}

// names are the account and instance names of a set of rows, by id.
type names struct {
	accounts  map[string]string
	instances map[string]string
}

// namesOf reads the names of the accounts accts and of their instances.
func (v *service) namesOf(ctx context.Context, accts []sandgate.Account) (names, error) {
	n := names{accounts: map[string]string{}, instances: map[string]string{}}
	ids := make([]string, 0, len(accts))
	for _, a := range accts {
		n.accounts[a.ID] = a.Name
		ids = append(ids, a.ID)
	}
	ins, err := v.db.InstancesOf(ctx, ids)
	if err != nil {
		return n, storeFailed(err)
	}
	for _, in := range ins {
		n.instances[in.ID] = in.Name
	}
	return n, nil
}

// named fills in a workspace's account and instance names.
func (n names) named(w adminapi.Workspace) adminapi.Workspace {
	w.AccountName, w.InstanceName = n.accounts[w.AccountID], n.instances[w.InstanceID]
	return w
}
