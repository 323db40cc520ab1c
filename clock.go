package sandgate

import "time"

// Clock tells the time. Every decision reads one Clock so that tests can
// control time; production uses SystemClock.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock, in UTC.
type SystemClock struct{}

// Now returns the current time in UTC.
func (SystemClock) Now() time.Time { return time.Now().UTC() }
