package flymachines

// PauseRefill stops p's pool from making Machines, so that a test sees
// only the calls of its creates.
func PauseRefill(p *Provider) {
	p.pool.Pause()
}
