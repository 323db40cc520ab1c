package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
)

// commandStats is redis-server's INFO commandstats: per command, its calls
// and the µs spent in it (a script's own commands are counted apart from
// the EVALSHA that ran them, whose µs include theirs).
type commandStats map[string]commandStat

type commandStat struct {
	calls int64
	usec  int64
}

// readCommandStats asks the redis-server on port for its commandstats.
func readCommandStats(ctx context.Context, port int) (commandStats, error) {
	out, err := exec.CommandContext(ctx, "redis-cli", "-p", strconv.Itoa(port), "INFO", "commandstats").Output()
	if err != nil {
		return nil, fmt.Errorf("redis-cli INFO commandstats: %w", err)
	}
	st := commandStats{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var s commandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				s.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		st[strings.TrimPrefix(name, "cmdstat_")] = s
	}
	return st, sc.Err()
}

// printPerPair prints what each command cost per pair between before and
// after (n pairs): calls and µs inside redis-server, EVALSHA first (its µs
// hold its scripts' commands), then the commands the scripts ran, most
// expensive first. Anything the broker ran besides the pairs in that time
// (its background loops) is in the figures too.
func printPerPair(before, after commandStats, n int) {
	type row struct {
		name        string
		calls, usec float64
	}
	var rows []row
	var inner row
	for name, a := range after {
		b := before[name]
		if a.calls == b.calls || strings.HasPrefix(name, "info") || strings.HasPrefix(name, "config") {
			continue
		}
		r := row{name, float64(a.calls-b.calls) / float64(n), float64(a.usec-b.usec) / float64(n)}
		rows = append(rows, r)
		if name != "evalsha" && name != "eval" {
			inner.calls += r.calls
			inner.usec += r.usec
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if (rows[i].name == "evalsha") != (rows[j].name == "evalsha") {
			return rows[i].name == "evalsha"
		}
		return rows[i].usec > rows[j].usec
	})
	fmt.Printf("| command | calls a pair | µs a pair in redis-server |\n| --- | ---: | ---: |\n")
	for _, r := range rows {
		fmt.Printf("| %s | %.2f | %.1f |\n", r.name, r.calls, r.usec)
	}
	fmt.Printf("| (all but EVALSHA) | %.2f | %.1f |\n", inner.calls, inner.usec)
}
