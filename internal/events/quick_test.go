package events

import (
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// ApplyQuick (the watcher's read loop) takes a run's steps, which commit nothing, and leaves every
// other change to Apply having changed nothing: a run's end (an event to commit), a snapshot, and
// any chunk while the machine's lock is held elsewhere (a Track or a look-up committing). The run
// is reported once, by Apply, and what ApplyQuick took counts for it.
func TestApplyQuickTakesOnlyChangesWithNothingToCommit(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	quick := func(snapshot bool, rows ...t3rpc.ThreadShell) bool {
		return e.d.ApplyQuick(watch.Change{Machine: "m", Snapshot: snapshot, Threads: watch.RowsOf(rows)})
	}
	txs := e.txs()
	if !quick(false, rowAt("2026-12-01T10:00:00Z", "t1", "starting", "r1", "r1", "")) ||
		!quick(false, rowAt("2026-12-01T10:00:01Z", "t1", "running", "r1", "r1", "")) {
		t.Fatal("a run's start and step not taken at once")
	}
	if e.txs() != txs {
		t.Fatalf("%d transactions for a run's start and step", e.txs()-txs)
	}
	// The machine's lock held elsewhere: not even a step is taken at once (it would wait).
	mu := e.d.machineLock("m")
	mu.Lock()
	held := quick(false, rowAt("2026-12-01T10:00:02Z", "t1", "running", "r1", "r1", ""))
	mu.Unlock()
	if held {
		t.Fatal("a change taken at once while the machine's lock was held elsewhere")
	}
	if quick(true, rowAt("2026-12-01T10:00:02Z", "t1", "running", "r1", "r1", "")) {
		t.Fatal("a snapshot taken at once")
	}
	end := rowAt("2026-12-01T10:00:03Z", "t1", "completed", "", "r1", "")
	if quick(false, end) {
		t.Fatal("a run's end taken at once: its event must be committed first")
	}
	if e.txs() != txs {
		t.Fatalf("ApplyQuick wrote %d transactions", e.txs()-txs)
	}
	e.want()
	e.apply(end) // as the watcher's goroutine does next
	e.want("completed r1")
	if got := e.stored("t1"); got.Latest != "r1" || !got.Settled {
		t.Fatalf("after the run's end the store holds %+v", got)
	}
}
