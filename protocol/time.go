package protocol

import "time"

// Time formats t as the wire's times are: RFC 3339 in UTC, whole seconds.
func Time(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

// TimePtr is Time for an optional field: nil for the zero time.
func TimePtr(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := Time(t)
	return &s
}
