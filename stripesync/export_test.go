package stripesync

// SetAfterSend sets a hook run after each send Stripe accepted and before
// the cursor moves; its error ends the round as a crash there would.
func SetAfterSend(s *Syncer, f func(entryID string) error) { s.afterSend = f }
