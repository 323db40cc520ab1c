package flymachines

// PauseRefill stops p's pool from making Machines, so that a test sees
// only the calls of its creates.
func PauseRefill(p *Provider) {
	p.pool.Pause()
}

// HoldSettle holds the binds and relabels of the takes that follow, off
// the acquire path, until release is called.
func HoldSettle(p *Provider) (release func()) {
	h := make(chan struct{})
	p.pool.hold = h
	return func() {
		p.pool.hold = nil
		close(h)
	}
}
