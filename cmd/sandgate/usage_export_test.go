package main

import (
	"io"
	"testing"
)

// An export's rows are counted as CSV records, not lines: an adjustment's
// reason may hold a line break inside its quoted field, and a chunk of
// the stream may end anywhere, inside a field included. JSONL escapes
// line breaks, so a LF is a row there.
func TestProgressCountsRecords(t *testing.T) {
	csvOut := "id,reason\r\nadj:1,\"outage\r\nticket 12, said \"\"sorry\"\"\"\r\nadj:2,plain\r\n"
	for split := range len(csvOut) + 1 {
		p := &progress{csv: true}
		w := p.wrap(io.Discard)
		w.Write([]byte(csvOut[:split]))
		w.Write([]byte(csvOut[split:]))
		if p.rows != 3 {
			t.Fatalf("CSV split at %d: %d rows counted; want 3 (the header and two rows)", split, p.rows)
		}
	}
	p := &progress{}
	p.wrap(io.Discard).Write([]byte("{\"reason\":\"a\\nb \\\"q\\\"\"}\n{\"reason\":\"c\"}\n"))
	if p.rows != 2 {
		t.Errorf("JSONL: %d rows counted; want 2", p.rows)
	}
}
