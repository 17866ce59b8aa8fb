// Package threadstate reads what a T3 thread row means for the connector: has
// its run settled, and how; is a question pending. The wait logic and the event
// detector both decide from these rules, so they never disagree.
package threadstate

import "github.com/t3code-mcp/t3code-mcp/gen/t3rpc"

// Outcome is what became of a run: it settled (completed, interrupted, failed) or it asks
// (question). It is the one type for these outcomes: a wait returns it (wait.Reason adds the
// wait's own reasons to stop) and an event reports it (events makes the webhook type from it).
type Outcome string

const (
	Completed   Outcome = "completed"
	Interrupted Outcome = "interrupted"
	Failed      Outcome = "failed"
	// Question: the run waits on a pending request, a question or an approval.
	Question Outcome = "question"
)

// Settled maps a T3 run (or thread) status to an outcome. T3's "waiting" means
// the agent's turn is over but the checkpoint is not captured yet: not settled.
// cancelled (a queued run dropped) reads as interrupted, rolled_back as failed
// of that run's work; both are terminal in T3.
func Settled(status string) (Outcome, bool) {
	switch status {
	case "completed":
		return Completed, true
	case "interrupted", "cancelled":
		return Interrupted, true
	case "failed", "rolled_back":
		return Failed, true
	}
	return "", false
}

// busyStatus reports a run status in which a run is underway or queued
// (including "waiting": the turn is over, the checkpoint not yet captured).
func busyStatus(status string) bool {
	switch status {
	case "preparing", "queued", "starting", "running", "waiting":
		return true
	}
	return false
}

// Pending is a runtime request the thread waits on.
type Pending struct {
	ID   string
	Kind string // "user_input" for a question; anything else is an approval
}

// IsQuestion reports whether the request asks the user for input.
func (p Pending) IsQuestion() bool { return p.Kind == "user_input" }

// PendingRequest returns the thread's pending runtime request, if any.
func PendingRequest(t *t3rpc.ThreadShell) (Pending, bool) {
	r, ok := t.PendingRuntimeRequest.Get()
	if !ok {
		return Pending{}, false
	}
	return Pending{ID: r.ID, Kind: r.Kind}, true
}

// LatestRun returns the thread's latest run id ("" when it has none).
func LatestRun(t *t3rpc.ThreadShell) string {
	if v, ok := t.LatestRunId.Get(); ok {
		return v
	}
	return ""
}

// ActiveRun returns the thread's active run id ("" when none).
func ActiveRun(t *t3rpc.ThreadShell) string {
	if v, ok := t.ActiveRunId.Get(); ok {
		return v
	}
	return ""
}
