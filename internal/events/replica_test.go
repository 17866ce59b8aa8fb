package events

import (
	"sync"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// leaseEnv is an env whose detector runs in replica mode: the test decides whether this replica
// holds machine m's lease (and its token), what its watcher holds, and which token the store
// still accepts (the PostgreSQL store's fence check, played by fencedStore over a real bbolt file).
type leaseEnv struct {
	*env
	mu      sync.Mutex
	token   int64 // the lease as this replica believes it (0: not held)
	current int64 // the machine's token in the shared store
	rows    []t3rpc.ThreadShell
	fences  []*store.Fence // every fenced detector commit
	loads   int            // detector states read from the store
}

type fencedStore struct {
	*store.Group
	l *leaseEnv
}

func (f fencedStore) Commit(b store.Batch) error {
	if b.Fence != nil {
		f.l.mu.Lock()
		f.l.fences = append(f.l.fences, b.Fence)
		stale := b.Fence.Token != f.l.current
		f.l.mu.Unlock()
		if stale {
			return store.ErrFenced
		}
	}
	return f.Group.Commit(b)
}

func (f fencedStore) Detector(k string) ([]byte, bool, error) {
	f.l.mu.Lock()
	f.l.loads++
	f.l.mu.Unlock()
	return f.Group.Detector(k)
}

func newLeaseEnv(t *testing.T) *leaseEnv {
	l := &leaseEnv{env: newEnv(t, "")}
	l.d = New(Options{
		Store: fencedStore{store.NewGroup(l.st), l}, Tracked: l.st, Read: ReaderFunc(l.read), Logger: quiet(),
		Lease: func(machine string) (int64, bool) {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.token, machine == "m" && l.token != 0
		},
		Rows: func(string) []t3rpc.ThreadShell {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.rows
		},
	})
	return l
}

// see is the watcher applying a row: its state holds it, then the detector is handed it.
func (l *leaseEnv) see(r t3rpc.ThreadShell) {
	l.mu.Lock()
	l.rows = []t3rpc.ThreadShell{r}
	l.mu.Unlock()
	l.apply(r)
}

func (l *leaseEnv) setLease(believed, current int64) {
	l.mu.Lock()
	l.token, l.current = believed, current
	l.mu.Unlock()
}

// TestOnlyTheLeaseHolderDetectsAndCatchesUpOnGain: a replica without the lease commits nothing for
// the machine's chunks; when it gains the lease it judges its watcher's rows against the stored
// state and reports the run that ended while it was not detecting, every commit fenced with its
// token.
func TestOnlyTheLeaseHolderDetectsAndCatchesUpOnGain(t *testing.T) {
	l := newLeaseEnv(t)
	l.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"}) // any replica may track
	l.setLease(0, 0)
	l.see(row("t1", "running", "r1", "r1", ""))
	l.see(row("t1", "completed", "", "r1", ""))
	l.want()
	l.setLease(3, 3)
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	// The watcher's row shows the latest run settled, but a snapshot cannot tell what came
	// between: a look-up confirms it from the thread.
	l.setRuns("t1", fakeRun{id: "r1", status: "completed"})
	l.lookups()
	l.want("completed r1")
	l.see(row("t1", "completed", "", "r1", "")) // the same chunk again: nothing new
	l.want("completed r1")
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.fences) == 0 {
		t.Fatal("no commit carried a fence")
	}
	for _, f := range l.fences {
		if *f != (store.Fence{Machine: "m", Token: 3}) {
			t.Fatalf("commit fenced with %+v, want machine m token 3", *f)
		}
	}
}

// TestATakeoverMidStreamLosesNothing: the holder detected run 1; runs 2 and 3 came and went
// while the lease was moving (no one detecting); the new holder reports both, in order, once.
func TestATakeoverMidStreamLosesNothing(t *testing.T) {
	l := newLeaseEnv(t)
	l.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	l.setLease(1, 1)
	l.see(row("t1", "running", "r1", "r1", ""))
	l.see(row("t1", "completed", "", "r1", ""))
	// Gaining the lease after the baseline, the replica cannot tell from rows alone what came
	// between: a look-up settles it.
	l.setRuns("t1", fakeRun{id: "r1", status: "completed"})
	l.lookups()
	l.want("completed r1")
	l.setLease(0, 1) // renewals failed: this replica stops detecting
	l.see(row("t1", "running", "r2", "r2", ""))
	l.see(row("t1", "completed", "", "r3", ""))
	l.want("completed r1")
	l.setLease(2, 2) // gained again, a new tenure
	l.setRuns("t1", fakeRun{id: "r1", status: "completed"}, fakeRun{id: "r2", status: "failed"}, fakeRun{id: "r3", status: "completed"})
	l.see(row("t1", "completed", "", "r3", "")) // the first chunk of the tenure catches up
	l.lookups()
	l.want("completed r1", "failed r2", "completed r3")
}

// TestAFencedCommitIsDroppedNotRetried: the replica believes it holds the lease but the store has
// moved on (another replica took it): the chunk is passed over without error (the watcher must
// not hold the stream for a machine that is no longer ours) and nothing is written.
func TestAFencedCommitIsDroppedNotRetried(t *testing.T) {
	l := newLeaseEnv(t)
	l.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	l.setLease(4, 4)
	l.see(row("t1", "running", "r1", "r1", ""))
	l.setLease(4, 5)
	l.see(row("t1", "completed", "", "r1", ""))
	l.want()
	// The store's state is the last one committed under token 4: the new holder reports r1.
	l.setLease(5, 5)
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	l.setRuns("t1", fakeRun{id: "r1", status: "completed"})
	l.lookups()
	l.want("completed r1")
}

// TestALeaseBackUnderTheSameTokenCatchesUp: the lease lapsed locally (the replica stopped
// detecting) while a run ended, then came back under the token it had. The chunk passed over
// meanwhile was acknowledged to T3 and will not come again: the detector catches up before it
// detects again, instead of trusting the tenure it had under that token.
func TestALeaseBackUnderTheSameTokenCatchesUp(t *testing.T) {
	l := newLeaseEnv(t)
	l.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	l.setLease(1, 1)
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	l.see(row("t1", "running", "r1", "r1", ""))
	l.setLease(0, 1) // lapsed: Held says no
	l.see(row("t1", "completed", "", "r1", ""))
	l.want()
	l.setLease(1, 1) // back under the same token
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	l.setRuns("t1", fakeRun{id: "r1", status: "completed"})
	l.lookups()
	l.want("completed r1")
}

// TestALookUpGivenUpWhileTheLeaseLapsedIsTakenUpAgain: a look-up found the lease not held and
// was dropped (its note stays in the store for the holder); the lease came back under the same
// token: the note is taken up again, and the run it was for is reported.
func TestALookUpGivenUpWhileTheLeaseLapsedIsTakenUpAgain(t *testing.T) {
	l := newLeaseEnv(t)
	l.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	l.setLease(1, 1)
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	l.see(row("t1", "running", "r1", "r1", ""))
	// r1 is passed over by a queued r2 (no longer active): only a look-up can say how it ended.
	l.see(row("t1", "running", "r2", "r2", ""))
	l.setLease(0, 1)
	l.setRuns("t1", fakeRun{id: "r1", status: "completed"}, fakeRun{id: "r2", status: "running"})
	l.lookups() // not held: given up
	l.want()
	l.setLease(1, 1)
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	l.lookups()
	l.want("completed r1")
}
