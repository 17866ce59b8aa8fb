package outbox

import (
	"context"
	"runtime/trace"
	"strconv"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Trace marks: while a runtime trace runs (runtime/trace.IsEnabled: `t3code-load -trace`, or
// /debug/pprof/trace), the outbox logs the points of an event's way from "durable" to "the
// receiver has it", so that a trace can be joined per event (the category names the point, the
// message the event's id; the goroutine and the time are the trace's own):
//
//	t3mcp.durable   the group commit handed the event over (message: "<id> <µs since CreatedAt>")
//	t3mcp.enrich    the event's head enrichment starts (its body is completed from T3 first)
//	t3mcp.attempt   a delivery worker starts the event's attempt
//	t3mcp.written   the request's bytes were written to the connection (no id: the worker's last attempt)
//	t3mcp.answered  the attempt's answer was read (or it failed)
//
// With the goroutines' state changes (the worker waiting for the answer, made runnable by the
// network poller, running again) they split the round trip; the receiver in the load harness
// logs loadtest.received with the same id. Off (no trace), a mark costs one atomic load.
const (
	markDurable  = "t3mcp.durable"
	markEnrich   = "t3mcp.enrich"
	markAttempt  = "t3mcp.attempt"
	markWritten  = "t3mcp.written"
	markAnswered = "t3mcp.answered"
)

// markEvent logs mark for id when a trace runs.
func markEvent(mark, id string) {
	if trace.IsEnabled() {
		trace.Log(context.Background(), mark, id)
	}
}

// markDurableEvents logs the durable mark of each of evs, with its lag since CreatedAt (T3's
// time of the transition) in µs, when a trace runs.
func markDurableEvents(evs []store.Event) {
	if !trace.IsEnabled() {
		return
	}
	now := time.Now()
	for _, e := range evs {
		trace.Log(context.Background(), markDurable, e.ID+" "+strconv.FormatInt(now.Sub(e.CreatedAt).Microseconds(), 10))
	}
}
