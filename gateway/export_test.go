package gateway

// InflightStats are the in-flight counters of one gateway process.
type InflightStats struct {
	Requests int   // requests counted against the caps
	Bytes    int64 // bytes reserved, by those and by durable commands
}

// InflightStats bridges the process's in-flight counters to the tests.
func (s *Server) InflightStats() InflightStats {
	f := s.inflight
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.ws {
		n += v
	}
	return InflightStats{Requests: n, Bytes: f.used}
}
