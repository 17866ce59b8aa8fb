package threadstate

import "github.com/t3code-mcp/t3code-mcp/gen/t3rpc"

// Verdict is what one shell row can say about one run.
//
// A V2 shell row carries two run pointers, activeRunId and latestRunId, and a
// status that follows the *newest* run, not the thread ("Verified live
// 2026-12-01" in the protocol reference): it says "queued" while run 1 still
// runs and run 2 waits behind it, and "cancelled" when the newest queued run
// was cancelled while an older one runs on. So a run is judged from the
// pointers first and from status only where status is about that run.
type Verdict int

const (
	// RunUnknown: the row says nothing about this run (it is neither the active
	// nor the latest run: an older run, or one queued between the two). Read
	// the run itself to know.
	RunUnknown Verdict = iota
	// RunBusy: the run is underway, or queued to run.
	RunBusy
	// RunSettled: the run is over and the row says how (Outcome).
	RunSettled
	// RunSettledUnreadable: the run is over (nothing is active and it is the
	// latest run), but the row's status does not say how — a server that
	// reports "idle" after a run, or a status this connector does not know.
	// Read the run for its outcome.
	RunSettledUnreadable
)

func (v Verdict) String() string {
	switch v {
	case RunBusy:
		return "busy"
	case RunSettled:
		return "settled"
	case RunSettledUnreadable:
		return "settled (outcome not in the row)"
	}
	return "unknown"
}

// Judge tells what the row says about run runID. For the latest run it also
// returns the outcome when the row says the run settled.
func Judge(t *t3rpc.ThreadShell, runID string) (Outcome, Verdict) {
	if runID == "" {
		return "", RunUnknown
	}
	active, hasActiveField := activeRun(t)
	if active == runID {
		return "", RunBusy
	}
	if runID != LatestRun(t) {
		return "", RunUnknown
	}
	if out, ok := Settled(t.Status); ok {
		// Terminal status is about the latest run, whatever else is active
		// (the newest queued run cancelled while an older one runs on).
		return out, RunSettled
	}
	if busyStatus(t.Status) {
		// Queued behind the active run, or between runs (the active pointer
		// cleared a moment before the queued run starts).
		return "", RunBusy
	}
	if !hasActiveField {
		// A row without run pointers: status is all there is, and it is
		// neither busy nor terminal ("idle" or an unknown word).
		return "", RunSettledUnreadable
	}
	if active != "" {
		return "", RunBusy // something runs and the latest run is not over by its status
	}
	return "", RunSettledUnreadable
}

// Busy reports whether a run of the thread is underway or queued: the row has
// an active run, or (a row without run pointers, or between two runs) its
// status is a busy run status.
func Busy(t *t3rpc.ThreadShell) bool {
	if a, _ := activeRun(t); a != "" {
		return true
	}
	return busyStatus(t.Status)
}

// activeRun returns the active run id and whether the row carries the field
// at all (null counts as carried: "no active run").
func activeRun(t *t3rpc.ThreadShell) (string, bool) {
	if v, ok := t.ActiveRunId.Get(); ok {
		return v, true
	}
	return "", t.ActiveRunId.Set
}
