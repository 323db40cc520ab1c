package admission

import "time"

// SetClock makes l read the time from now: when requests come, and when
// what they borrowed expires.
func SetClock(l *Limiter, now func() time.Time) { l.now = now }

// WaitBorrow waits until no batch borrow of the lease's class is in
// flight in l.
func WaitBorrow(l *Limiter, leaseID string, class Class) {
	b := l.bucket(bucketKey{leaseID, class})
	b.mu.Lock()
	wait := b.borrowing
	b.mu.Unlock()
	if wait != nil {
		<-wait
	}
}

// DropBuckets starts l's buckets over, as maxBuckets of them do.
func DropBuckets(l *Limiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropBucketsLocked()
}
