package console

import (
	"bufio"
	"bytes"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The overview's refusals by code come from this process's own request
// counter, sandgate_http_requests_total{route,status,code} on /metrics:
// the console samples it (at most once a minute, when a page asks) and
// answers the growth of each code's count since the oldest sample of the
// last hour. A counter has no history, so right after a start the window
// is shorter; the page says since when it counts.

// requestsMetric is the Prometheus name of the gateway's request counter.
const requestsMetric = "sandgate_http_requests_total"

// refusals keeps the samples. It is safe for concurrent use.
type refusals struct {
	metrics http.Handler // nil: no counter to read
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at     time.Time
	counts map[string]int64 // code → requests answered with it
}

// refusalRow is one code of the overview's table.
type refusalRow struct {
	Code string
	N    int64
}

// window reads the counter now and returns the refusals by code since
// the oldest sample within the last hour, and that sample's time.
func (rf *refusals) window(r *http.Request, now time.Time) ([]refusalRow, time.Time, bool) {
	if rf.metrics == nil {
		return nil, time.Time{}, false
	}
	cur, ok := rf.read(r)
	if !ok {
		return nil, time.Time{}, false
	}
	rf.mu.Lock()
	defer rf.mu.Unlock()
	rf.samples = slices.DeleteFunc(rf.samples, func(s sample) bool { return now.Sub(s.at) > time.Hour })
	if n := len(rf.samples); n == 0 || now.Sub(rf.samples[n-1].at) >= time.Minute {
		rf.samples = append(rf.samples, sample{at: now, counts: cur})
	}
	base := rf.samples[0]
	var out []refusalRow
	for code, n := range cur {
		if d := n - base.counts[code]; d > 0 {
			out = append(out, refusalRow{Code: code, N: d})
		}
	}
	slices.SortFunc(out, func(a, b refusalRow) int {
		if a.N != b.N {
			return int(b.N - a.N)
		}
		return strings.Compare(a.Code, b.Code)
	})
	return out, base.at, true
}

// read scrapes the metrics handler in process and sums the request
// counter by code, over refusals only (a non-empty code).
func (rf *refusals) read(r *http.Request) (map[string]int64, bool) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "/metrics", nil)
	if err != nil {
		return nil, false
	}
	req.RemoteAddr = r.RemoteAddr
	rec := &recorder{header: http.Header{}}
	rf.metrics.ServeHTTP(rec, req)
	if rec.status != 0 && rec.status != http.StatusOK {
		return nil, false
	}
	return parseRefusals(rec.body.Bytes()), true
}

// parseRefusals sums the Prometheus text exposition's requestsMetric
// samples by their code label, skipping those without one.
func parseRefusals(b []byte) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, requestsMetric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		code := label(labels, "code")
		if code == "" {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			continue
		}
		out[code] += int64(v)
	}
	return out
}

// label returns the value of name in a Prometheus label set
// (a="x",b="y"); label values here are codes, without escapes.
func label(set, name string) string {
	for _, kv := range strings.Split(set, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
