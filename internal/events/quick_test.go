package events

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
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

// idsTracked records the ids of every GetThreads call.
type idsTracked struct {
	Tracked
	mu    sync.Mutex
	calls [][]string
}

func (c *idsTracked) GetThreads(ids []string) (map[string]store.Thread, error) {
	c.mu.Lock()
	c.calls = append(c.calls, slices.Sorted(slices.Values(ids)))
	c.mu.Unlock()
	return c.Tracked.GetThreads(ids)
}

// A chunk that settles some threads' runs among other threads' steps reads the tracked records
// of the settling threads alone: the others' rows commit nothing and go into their cached states
// (quietThreads), as a chunk of steps alone does. A thread with a step and then its run's end in
// the same chunk is read and reported; the threads that only stepped report their runs' ends
// later from what the chunk left in their cached states.
func TestChunkReadsOnlyTheThreadsThatCommit(t *testing.T) {
	e := newEnv(t, "")
	ct := &idsTracked{Tracked: e.st}
	e.d = New(Options{Store: e.g, Tracked: ct, Read: ReaderFunc(e.read), Logger: quiet()})
	for _, id := range []string{"t1", "t2", "t3", "t4"} {
		e.watchThread(id, "", &t3rpc.ThreadShell{ID: id, Status: "idle"})
	}
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "running", "r1", "r1", ""),
		rowAt("2026-12-01T10:00:00Z", "t2", "running", "r2", "r2", ""),
		rowAt("2026-12-01T10:00:00Z", "t3", "running", "r3", "r3", ""),
		rowAt("2026-12-01T10:00:00Z", "t4", "running", "r4", "r4", ""))
	ct.mu.Lock()
	ct.calls = nil
	ct.mu.Unlock()
	// More rows than nothingToCommit tries, so that the chunk goes through applyLocked.
	var c watch.Change
	c.Machine = "m"
	for i := 1; i <= 4; i++ {
		at := fmt.Sprintf("2026-12-01T10:00:%02dZ", i)
		for _, id := range []string{"t1", "t2", "t4"} {
			r := rowAt(at, id, "running", "r"+id[1:], "r"+id[1:], "")
			c.Passed = append(c.Passed, &r)
		}
	}
	end2 := rowAt("2026-12-01T10:00:05Z", "t2", "completed", "", "r2", "")
	end3 := rowAt("2026-12-01T10:00:05Z", "t3", "completed", "", "r3", "")
	step1 := rowAt("2026-12-01T10:00:05Z", "t1", "running", "r1", "r1", "")
	c.Threads = watch.RowsOf([]t3rpc.ThreadShell{end2, end3, step1})
	if err := e.d.Apply(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	e.want("completed r2", "completed r3")
	ct.mu.Lock()
	calls := ct.calls
	ct.mu.Unlock()
	if len(calls) != 1 || !slices.Equal(calls[0], []string{"t2", "t3"}) {
		t.Fatalf("GetThreads calls %v, want one for [t2 t3]", calls)
	}
	// The quiet threads' states moved on with the chunk: their runs' ends are reported.
	e.apply(rowAt("2026-12-01T10:00:06Z", "t1", "completed", "", "r1", ""),
		rowAt("2026-12-01T10:00:06Z", "t4", "completed", "", "r4", ""))
	e.want("completed r2", "completed r3", "completed r1", "completed r4")
	if got := e.stored("t4"); got.Latest != "r4" || !got.Settled || got.UpdatedAt != "2026-12-01T10:00:06Z" {
		t.Fatalf("t4's stored state %+v", got)
	}
}
