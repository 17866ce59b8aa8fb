package outbox

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff is a retry policy: NewBackOff returns a fresh backoff.BackOff for one event, whose
// NextBackOff gives the delay before each of its retries in turn. The outbox keeps one per
// failing stream head (and one per head whose enrichment fails), so the delays grow per event,
// and a Retry-After from the receiver replaces the delay it would have given.
// NewBackOff may be called from two goroutines at once (the loop's, and the group commit's when
// the hand-over starts a delivery).
type Backoff interface {
	NewBackOff() backoff.BackOff
}

// ExponentialBackoff is exponential backoff with full jitter: retry n waits a uniformly random
// delay between 0 and min(Cap, Base·2^(n-1)). Full jitter spreads the retries of many failed
// events (after a receiver outage every stream failed at about the same time) instead of having
// them arrive in synchronized waves.
type ExponentialBackoff struct {
	Base, Cap time.Duration
}

// NewBackOff implements Backoff with backoff.ExponentialBackOff: an interval starting at Base/2,
// doubling up to Cap/2, randomized by ±100 %, is a uniform delay in [0, min(Cap, Base·2^(n-1))].
func (b ExponentialBackoff) NewBackOff() backoff.BackOff {
	if b.Base <= 0 || b.Cap <= 0 {
		return &backoff.ZeroBackOff{}
	}
	eb := &backoff.ExponentialBackOff{
		InitialInterval:     b.Base / 2,
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         max(b.Cap/2, b.Base/2),
	}
	eb.Reset()
	return capped{eb, b.Cap}
}

// capped keeps a BackOff's delays at or below a ceiling (the library's randomization may add a
// nanosecond above twice the interval).
type capped struct {
	backoff.BackOff
	ceil time.Duration
}

func (c capped) NextBackOff() time.Duration {
	d := c.BackOff.NextBackOff()
	if d == backoff.Stop {
		return d
	}
	return max(0, min(d, c.ceil))
}

// DefaultBackoff: base 1s, cap 5min.
var DefaultBackoff Backoff = ExponentialBackoff{Base: time.Second, Cap: 5 * time.Minute}

// advanced returns a fresh BackOff of p that has already given n delays: the state of an event
// that failed n times before this process (re)started.
func advanced(p Backoff, n int) backoff.BackOff {
	bo := p.NewBackOff()
	for range min(n, 64) { // the exponential policies reach their cap long before 64
		bo.NextBackOff()
	}
	return bo
}
