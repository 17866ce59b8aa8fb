package events

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// rowAt is row with the row's updatedAt set.
func rowAt(at, id, status, active, latest, pending string) t3rpc.ThreadShell {
	r := row(id, status, active, latest, pending)
	r.UpdatedAt = t3rpc.NewOptString(at)
	return r
}

// stored is the detector state of thread id on machine m as the store holds it.
func (e *env) stored(id string) seen {
	e.t.Helper()
	raw, ok, err := e.st.Detector(key("m", id))
	if err != nil || !ok {
		e.t.Fatalf("detector state of %s: found %v, %v", id, ok, err)
	}
	var s seen
	if err := json.Unmarshal(raw, &s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) txs() uint64 {
	txs, _ := e.g.Stats()
	return txs
}

// A run's start and its steps up to its end change only the row's updatedAt, activeRunId and
// latestRunId (an unsettled new run): the chunks that carry them commit nothing (their Ack need
// not wait for the group commit; seen.sameDurable). The run's end writes the newest state.
func TestUpdatedAtAloneIsNotCommitted(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	before := e.txs()
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "starting", "r1", "r1", ""))
	e.apply(rowAt("2026-12-01T10:00:01Z", "t1", "running", "r1", "r1", ""))
	// The turn is over, the checkpoint not captured yet: T3 drops activeRunId (recorded).
	e.apply(rowAt("2026-12-01T10:00:02Z", "t1", "waiting", "", "r1", ""))
	if n := e.txs(); n != before {
		t.Fatalf("%d transactions for a run's start and steps", n-before)
	}
	if got := e.stored("t1"); got.Latest != "" || got.UpdatedAt != "" {
		t.Fatalf("before the run's end the store holds %+v, want the baseline", got)
	}
	e.apply(rowAt("2026-12-01T10:00:03Z", "t1", "completed", "", "r1", ""))
	if n := e.txs(); n != before+1 {
		t.Fatalf("%d transactions for the run's end, want 1", n-before)
	}
	if got := e.stored("t1"); got.Latest != "r1" || !got.Settled || got.UpdatedAt != "2026-12-01T10:00:03Z" {
		t.Fatalf("after the run's end the store holds %+v", got)
	}
	e.want("completed r1")
}

// What a snapshot cannot tell again is still committed before the Ack: a question, a run passed
// over by a queued one (Open), a look-up's note.
func TestRunsFollowedAndQuestionsAreCommitted(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "running", "r1", "r1", ""))
	before := e.txs()
	e.apply(rowAt("2026-12-01T10:00:01Z", "t1", "running", "r1", "r1", "q1"))
	if got := e.stored("t1"); e.txs() != before+1 || got.Question != "q1" || got.Latest != "r1" {
		t.Fatalf("after a question: %d transactions, the store holds %+v", e.txs()-before, got)
	}
	// r2 queued behind r1 becomes the latest while r1 still runs: r1 is followed (Open).
	e.apply(rowAt("2026-12-01T10:00:02Z", "t1", "running", "r1", "r2", ""))
	if got := e.stored("t1"); e.txs() != before+2 || got.Latest != "r2" || len(got.Open) != 1 || got.Open[0] != "r1" {
		t.Fatalf("after a queued run: %d transactions, the store holds %+v", e.txs()-before, got)
	}
	e.want("question q1")
}

// After a crash between a run's start (not committed) and its end, the restart's snapshot finds
// a latest run the store does not know: one look-up, which reports nothing while the run is
// underway; the run's end is then reported once, from its row. Had it ended while the connector
// was down, the look-up reports it (TestTransitionWhileDownEmittedOnceAfterRestart).
func TestRestartAfterAnUncommittedStartReportsTheRunOnce(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(rowAt("2026-12-01T09:59:59Z", "t1", "running", "r0", "r0", ""))
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "completed", "", "r0", "")) // reported and committed
	e.apply(rowAt("2026-12-01T10:00:01Z", "t1", "running", "r1", "r1", ""))
	if got := e.stored("t1"); got.Latest != "r0" || !got.Settled {
		t.Fatalf("the store holds %+v, want r0 reported and r1's start not committed", got)
	}
	e.st.Close()

	e2 := newEnv(t, dir)
	e2.setRuns("t1", fakeRun{id: "r0", status: "completed"}, fakeRun{id: "r1", status: "running"})
	running := rowAt("2026-12-01T10:00:05Z", "t1", "running", "r1", "r1", "")
	e2.snapshot(running)
	if n := e2.lookups(); n != 0 || e2.reads != 1 {
		t.Fatalf("%d look-ups still pending after %d reads", n, e2.reads)
	}
	e2.apply(rowAt("2026-12-01T10:00:06Z", "t1", "waiting", "", "r1", ""))
	e2.apply(rowAt("2026-12-01T10:00:07Z", "t1", "completed", "", "r1", ""))
	e2.want("completed r0", "completed r1")
}

// The updatedAt held in memory is the newest: a reconnect's snapshot of a busy thread whose row
// did not change since the last chunk needs no look-up, exactly as when every updatedAt was
// committed. (A row that did change gets one: TestQuestionAskedAndAnsweredBetweenObservations.)
func TestSnapshotOfAnUnchangedBusyThreadNeedsNoLookup(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "starting", "r1", "r1", ""))
	last := rowAt("2026-12-01T10:00:05Z", "t1", "running", "r1", "r1", "")
	e.apply(last)
	e.snapshot(last)
	if n := e.lookups(); n != 0 || e.reads != 0 {
		t.Fatalf("%d look-ups pending, %d reads after a snapshot of an unchanged row", n, e.reads)
	}
	if e.stored("t1").Lookup {
		t.Fatal("a look-up noted for an unchanged row")
	}
}

// After a restart the store's updatedAt may be older than the last row seen (only a busy thread's
// can): the snapshot then looks the thread up once, which finds nothing new, and the run is
// still reported once when it ends.
func TestRestartWithAnOlderStoredUpdatedAtLooksUpOnce(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "starting", "r1", "r1", ""))
	last := rowAt("2026-12-01T10:00:05Z", "t1", "running", "r1", "r1", "")
	e.apply(last)
	e.st.Close()

	e2 := newEnv(t, dir)
	e2.setRuns("t1", fakeRun{id: "r1", status: "running"})
	e2.snapshot(last)
	if !e2.stored("t1").Lookup {
		t.Fatal("no look-up noted for a busy thread whose stored updatedAt is older than its row")
	}
	if n := e2.lookups(); n != 0 || e2.reads != 1 {
		t.Fatalf("%d look-ups still pending after %d reads", n, e2.reads)
	}
	e2.want()
	e2.apply(rowAt("2026-12-01T10:00:09Z", "t1", "completed", "", "r1", ""))
	e2.want("completed r1")
}

// A chunk that only moves watched threads' updatedAt (a run's steps) is judged from the cached
// states alone: no read of the tracked rows, no commit. A chunk with anything else in it (here a
// run's end, beside such a row) is read and judged as before.
func TestChunkMovingOnlyUpdatedAtReadsNothing(t *testing.T) {
	e := newEnv(t, "")
	ct := &countingTracked{Store: e.st}
	e.d = New(Options{Store: e.g, Tracked: ct, Read: ReaderFunc(e.read), Logger: quiet()})
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.watchThread("t2", "", &t3rpc.ThreadShell{ID: "t2", Status: "idle"})
	e.apply(rowAt("2026-12-01T10:00:00Z", "t1", "starting", "r1", "r1", ""), rowAt("2026-12-01T10:00:00Z", "t2", "starting", "r2", "r2", ""))
	ct.mu.Lock()
	ct.one, ct.many = 0, 0
	ct.mu.Unlock()
	txs := e.txs()
	err := e.d.Apply(context.Background(), watch.Change{Machine: "m",
		Passed:  watch.RowsOf([]t3rpc.ThreadShell{rowAt("2026-12-01T10:00:01Z", "t1", "running", "r1", "r1", "")}),
		Threads: watch.RowsOf([]t3rpc.ThreadShell{rowAt("2026-12-01T10:00:02Z", "t1", "waiting", "r1", "r1", ""), rowAt("2026-12-01T10:00:02Z", "t2", "running", "r2", "r2", "")})})
	if err != nil {
		t.Fatal(err)
	}
	if ct.one != 0 || ct.many != 0 || e.txs() != txs {
		t.Fatalf("a chunk of updatedAt changes read tracked threads %d+%d times and wrote %d transactions", ct.one, ct.many, e.txs()-txs)
	}
	// The newest updatedAt is what a snapshot is judged against: the same row needs no look-up.
	e.snapshot(rowAt("2026-12-01T10:00:02Z", "t1", "waiting", "r1", "r1", ""))
	if e.stored("t1").Lookup {
		t.Fatal("a look-up noted for the row last seen")
	}
	ct.mu.Lock()
	ct.one, ct.many = 0, 0
	ct.mu.Unlock()
	e.apply(rowAt("2026-12-01T10:00:03Z", "t2", "running", "r2", "r2", ""), rowAt("2026-12-01T10:00:03Z", "t1", "completed", "", "r1", ""))
	if ct.many != 1 {
		t.Fatalf("a chunk with a run's end read tracked threads %d times together, want 1", ct.many)
	}
	e.want("completed r1")
	if got := e.stored("t2"); got.Latest != "" || got.UpdatedAt != "" {
		t.Fatalf("t2's stored state %+v, want its baseline (its run's start is not committed)", got)
	}
}

// "event recorded" is a debug line: at info an event's commit writes nothing to the log (it runs
// before the chunk's Ack), at debug it names the event.
func TestEventRecordedLoggedAtDebug(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		e := newEnv(t, "")
		var buf bytes.Buffer
		e.d = New(Options{Store: e.g, Tracked: e.st, Read: ReaderFunc(e.read), Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))})
		e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
		e.apply(row("t1", "running", "r1", "r1", ""))
		e.apply(row("t1", "completed", "", "r1", ""))
		e.want("completed r1")
		id := e.records()[0].ID
		if got := strings.Contains(buf.String(), `msg="event recorded" id=`+id); got != (level == slog.LevelDebug) {
			t.Fatalf("at %v the log has the event's line: %v\n%s", level, got, buf.String())
		}
	}
}

// A chunk of more rows than nothingToCommitRows (a machine the connector lags behind) that only
// moves updatedAt goes through applyLocked, whose quietThreads takes every row into the cached
// states: no read of the tracked rows, nothing committed.
func TestLargeChunkOfUpdatedAtReadsNothing(t *testing.T) {
	e := newEnv(t, "")
	ct := &countingTracked{Store: e.st}
	e.d = New(Options{Store: e.g, Tracked: ct, Read: ReaderFunc(e.read), Logger: quiet()})
	var start, step []t3rpc.ThreadShell
	for i := range nothingToCommitRows + 1 {
		id := fmt.Sprintf("t%d", i)
		e.watchThread(id, "", &t3rpc.ThreadShell{ID: id, Status: "idle"})
		start = append(start, rowAt("2026-12-01T10:00:00Z", id, "starting", "r-"+id, "r-"+id, ""))
		step = append(step, rowAt("2026-12-01T10:00:01Z", id, "running", "r-"+id, "r-"+id, ""))
	}
	e.apply(start...)
	ct.mu.Lock()
	ct.one, ct.many = 0, 0
	ct.mu.Unlock()
	txs := e.txs()
	e.apply(step...)
	if ct.many != 0 || e.txs() != txs {
		t.Fatalf("a chunk of %d rows read tracked threads %d times together and wrote %d transactions, want 0 and 0", len(step), ct.many, e.txs()-txs)
	}
}
