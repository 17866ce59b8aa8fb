package threadstate

import (
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// RowOf is the shell row T3 shows for a thread whose projection is p, in the
// fields a run is judged by (status, activeRunId, latestRunId,
// pendingRuntimeRequest) and the display fields a wait result renders from the
// row (title, branch, worktree); every other field is base's (the last row
// seen). T3 builds the row from the same records: its status follows the
// newest run, activeRunId is the run underway (a queued run is not), and the
// pending request is the runtime request still pending ("Verified live
// 2026-12-01" in the protocol reference).
//
// ok is false where the projection cannot tell what the row says: no run
// yet, more than one run underway or more than one request pending (which
// one the row names is T3's choice), or a request pending while no run is
// underway (it may be a run's the projection trimmed away, or one the row
// has already dropped); and for a thread archived or deleted, which leaves
// the active list (a wait reports it archived, from the watcher, whatever
// became of its run). A caller then waits for the row itself.
func RowOf(p *t3api.ThreadProjection, base t3rpc.ThreadShell) (t3rpc.ThreadShell, bool) {
	if reached(p.Thread.ArchivedAt) || reached(p.Thread.DeletedAt) {
		return t3rpc.ThreadShell{}, false
	}
	var newest, active *t3api.Run
	for i := range p.Runs {
		r := &p.Runs[i]
		if newest == nil || r.Ordinal > newest.Ordinal {
			newest = r
		}
		if underway(r.Status) {
			if active != nil {
				return t3rpc.ThreadShell{}, false
			}
			active = r
		}
	}
	if newest == nil {
		return t3rpc.ThreadShell{}, false
	}
	var pending *t3api.RuntimeRequest
	for i := range p.RuntimeRequests {
		if q := &p.RuntimeRequests[i]; q.Status == "pending" {
			if pending != nil {
				return t3rpc.ThreadShell{}, false
			}
			pending = q
		}
	}
	if pending != nil && active == nil {
		return t3rpc.ThreadShell{}, false
	}
	row := base
	row.Status = newest.Status
	row.LatestRunId = t3rpc.NewOptNilString(newest.ID)
	row.ActiveRunId = t3rpc.OptNilString{Set: true, Null: true}
	if active != nil {
		row.ActiveRunId = t3rpc.NewOptNilString(active.ID)
	}
	row.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	if pending != nil {
		row.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(t3rpc.PendingRuntimeRequest{
			ID: pending.ID, Kind: pending.Kind, CreatedAt: t3rpc.OptString(pending.CreatedAt),
		})
	}
	if th := &p.Thread; th.ID != "" {
		row.Title = th.Title
		row.Branch = t3rpc.OptNilString(th.Branch)
		row.WorktreePath = t3rpc.OptNilString(th.WorktreePath)
	}
	return row, true
}

// reached reports a timestamp that is set (not null, not absent).
func reached(t t3api.OptNilString) bool { return t.Set && !t.Null }

// underway reports a run status in which the run is the thread's active one:
// busy, but not queued behind another.
func underway(status string) bool {
	return busyStatus(status) && status != "queued"
}
