package main

import (
	"strings"
	"text/tabwriter"
)

// table renders rows under a header as aligned text columns: every list
// a command prints in its table form goes through it.
func table(header []string, rows [][]string) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	tw.Write([]byte(strings.Join(header, "\t") + "\n"))
	for _, r := range rows {
		tw.Write([]byte(strings.Join(r, "\t") + "\n"))
	}
	tw.Flush()
	return strings.TrimRight(b.String(), "\n")
}
