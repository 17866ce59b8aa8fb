package outbox

import (
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Delivery by several replicas (a store.Claimer queue, PostgreSQL): each replica's loop keeps
// its own in-memory streams, and before an attempt a worker claims the event in the store. The
// store grants a claim only for a stream's head that no live claimant holds, so one event is
// never sent by two replicas at the same time and a stream's events go out in order whichever
// replica sends them. A claim outlives its attempt by a margin and is dropped with the event's
// final outcome; the claim of a replica that died expires after claimTTL and another replica
// takes the event over (sending it again with the same webhook-id: at least once, as always).
// The bbolt store has no claims: this file is not on its path.

const (
	// pollEvery bounds how long the loop sleeps when replicas share the queue: their commits do
	// not wake it (Notify is per process).
	pollEvery = time.Second
	// claimRetry is when a head another replica holds is tried again.
	claimRetry = time.Second
)

// claimTTL is how long a claim lasts: an attempt, its record and a margin.
func (o *Outbox) claimTTL() time.Duration { return max(time.Minute, 3*o.cfg.Timeout) }

// claim claims e for this outbox. When it cannot (another replica holds it or sends the head
// before it), out says to try again after claimRetry; when e is no longer pending (another
// replica delivered it), out carries the error the loop skips it on.
func (o *Outbox) claim(e store.Event, out *outcome) bool {
	ok, err := o.claimer.Claim(e.Seq, o.cfg.Claimant, o.claimTTL())
	if ok {
		return true
	}
	if err != nil {
		out.err = err
		return false
	}
	out.event, out.retryAt, out.retryIn = e, o.cfg.Clock().Add(claimRetry), claimRetry
	out.event.Body = nil
	return false
}
