package client

import (
	"context"
	"time"
)

// SetSleep replaces c's wait between attempts, so that tests see the waits
// the client chose without spending them.
func SetSleep(c *Client, f func(ctx context.Context, d time.Duration) error) { c.sleep = f }
