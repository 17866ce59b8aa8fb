package events

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// otherReplica is a second detector on the leaseEnv's store, holding machine m's lease under
// token when held: another replica sharing the database.
func otherReplica(l *leaseEnv, token int64, held *bool) *Detector {
	return New(Options{Store: store.NewGroup(l.st), Tracked: l.st, Read: ReaderFunc(l.read), Logger: quiet(),
		Lease: func(machine string) (int64, bool) { return token, machine == "m" && *held },
		Rows:  func(string) []t3rpc.ThreadShell { return nil }})
}

// heldEnv is a leaseEnv watching thread t1 whose replica holds machine m under token 1.
func heldEnv(t *testing.T) *leaseEnv {
	l := newLeaseEnv(t)
	l.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	l.setLease(1, 1)
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *leaseEnv) loadsSoFar() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loads
}

func (l *leaseEnv) stored(thread string) seen {
	l.t.Helper()
	raw, ok, err := l.st.Detector(key("m", thread))
	var s seen
	if err != nil || !ok || json.Unmarshal(raw, &s) != nil {
		l.t.Fatalf("detector state of %s: %s found=%v err=%v", thread, raw, ok, err)
	}
	return s
}

// TestReplicaCachesStateForItsTenure: while this replica holds the lease, a thread's state is
// read from the store once, then kept (the holder is its only writer): more chunks read nothing.
func TestReplicaCachesStateForItsTenure(t *testing.T) {
	l := heldEnv(t)
	l.see(row("t1", "running", "r1", "r1", ""))
	before := l.loadsSoFar()
	l.see(row("t1", "waiting", "r1", "r1", ""))
	l.see(row("t1", "completed", "", "r1", ""))
	l.see(row("t1", "running", "r2", "r2", ""))
	l.want("completed r1")
	if n := l.loadsSoFar() - before; n != 0 {
		t.Fatalf("%d detector states read from the store during the tenure, want 0 (cached)", n)
	}
}

// TestATakenOverLeaseUsesTheOtherReplicasState: this replica cached a thread's state, lost the
// lease, and another replica advanced the state (it reported r1 and r2). When this replica takes
// the lease back it judges from the other replica's state, not its own cache: nothing is
// reported again, no look-up is needed, and the next run is reported once.
func TestATakenOverLeaseUsesTheOtherReplicasState(t *testing.T) {
	l := heldEnv(t)
	l.see(row("t1", "running", "r1", "r1", "")) // cached: r1 running

	l.setLease(0, 2) // the other replica holds it now, token 2
	held := true
	other := otherReplica(l, 2, &held)
	for _, r := range []t3rpc.ThreadShell{
		row("t1", "completed", "", "r1", ""), row("t1", "running", "r2", "r2", ""), row("t1", "completed", "", "r2", ""),
	} {
		l.see(r) // passed over here
		if err := other.Apply(context.Background(), watch.Change{Machine: "m", Threads: watch.RowsOf([]t3rpc.ThreadShell{r})}); err != nil {
			t.Fatal(err)
		}
	}
	l.want("completed r1", "completed r2")
	held = false

	l.setLease(3, 3) // back here, a new tenure; the watcher's row is the one it saw last
	l.see(row("t1", "completed", "", "r2", ""))
	if n := l.lookups(); n != 0 {
		t.Fatalf("%d look-ups pending after the takeover, want none (the stored state says r2 is reported)", n)
	}
	if s := l.stored("t1"); s.Latest != "r2" || !s.Settled || s.Lookup {
		t.Fatalf("stored state %+v, want r2 settled, no look-up", s)
	}
	l.see(row("t1", "running", "r3", "r3", ""))
	l.see(row("t1", "completed", "", "r3", ""))
	l.want("completed r1", "completed r2", "completed r3")
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reads != 0 {
		t.Fatalf("%d reads of the thread from T3, want none", l.reads)
	}
}

// TestAWatchRenewedOnAnotherReplicaIsNotJudgedFromTheCache: the holder cached a thread's state;
// another replica (not the holder) turned the watch off and on again, which stores a new
// baseline. The holder judges from that baseline (the tracked row changed), so the runs that
// came while the thread was not watched are not reported.
func TestAWatchRenewedOnAnotherReplicaIsNotJudgedFromTheCache(t *testing.T) {
	l := heldEnv(t)
	l.see(row("t1", "running", "r1", "r1", ""))
	l.see(row("t1", "completed", "", "r1", ""))
	l.want("completed r1")

	held := false
	other := otherReplica(l, 9, &held)
	at := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)
	tr := store.Thread{ID: "t1", Machine: "m", ProjectID: "p1", ProjectTitle: "proj"}
	tr.Watch, tr.UpdatedAt = false, at
	if err := other.Track("m", tr, nil); err != nil {
		t.Fatal(err)
	}
	past := row("t1", "completed", "", "r5", "") // r2…r5 ran while nobody watched
	tr.Watch, tr.UpdatedAt = true, at.Add(time.Second)
	if err := other.Track("m", tr, &past); err != nil {
		t.Fatal(err)
	}

	l.see(past)
	if n := l.lookups(); n != 0 {
		t.Fatalf("%d look-ups pending, want none (the new baseline says r5 is the past)", n)
	}
	l.see(row("t1", "running", "r6", "r6", ""))
	l.see(row("t1", "completed", "", "r6", ""))
	l.want("completed r1", "completed r6")
}

// TestPruneOnlyByTheLeaseHolder: a replica prunes a machine's tracked threads and detector state
// only while it holds the machine's lease, fenced with its token: not while another replica
// holds it, nor when the lease moved on after this replica last looked (the fenced batch fails
// and nothing is deleted).
func TestPruneOnlyByTheLeaseHolder(t *testing.T) {
	l := newLeaseEnv(t)
	old := time.Now().Add(-DefaultRetention - time.Hour)
	if err := l.st.Commit(store.Batch{Threads: []store.Thread{{ID: "x", Machine: "m", CreatedAt: old, UpdatedAt: old}},
		Detector: map[string][]byte{key("m", "x"): []byte(`{"run":"r0","settled":true}`), key("m", "orphan"): []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	left := func() (threads, states int) { return l.left("x") }
	for _, c := range []struct {
		name              string
		believed, current int64
	}{{"held by another replica", 0, 1}, {"lease moved on", 1, 2}} {
		l.setLease(c.believed, c.current)
		if n, err := l.d.Prune(); err != nil || n != 0 {
			t.Fatalf("%s: Prune = %d, %v; want nothing pruned", c.name, n, err)
		}
		if th, st := left(); th != 1 || st != 2 {
			t.Fatalf("%s: %d threads and %d detector states left, want 1 and 2", c.name, th, st)
		}
	}
	l.setLease(2, 2)
	if n, err := l.d.Prune(); err != nil || n != 1 {
		t.Fatalf("the holder's Prune = %d, %v; want 1 thread", n, err)
	}
	if th, st := left(); th != 0 || st != 0 {
		t.Fatalf("%d threads and %d detector states left after the holder's prune, want none", th, st)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if last := l.fences[len(l.fences)-1]; *last != (store.Fence{Machine: "m", Token: 2}) {
		t.Fatalf("the prune was fenced with %+v, want machine m token 2", *last)
	}
}

// TestPruneKeepsATrackThroughAnotherReplica: the lease holder judged thread x (unwatched, past
// the retention, with left-over state) and thread y (no row, a dispatch's left-over state)
// prunable; before its commit another replica — whose Track no lock of the holder serialises
// with — watches both again, storing their rows and baselines. The holder's commit keeps them
// (its deletions are conditional on the rows it judged), and the next run of each is reported:
// no transition lost.
func TestPruneKeepsATrackThroughAnotherReplica(t *testing.T) {
	l := newLeaseEnv(t)
	l.setLease(1, 1)
	old := time.Now().Add(-DefaultRetention - time.Hour)
	if err := l.st.Commit(store.Batch{Threads: []store.Thread{{ID: "x", Machine: "m", CreatedAt: old, UpdatedAt: old}},
		Detector: map[string][]byte{key("m", "x"): []byte(`{"run":"r0","settled":true}`), key("m", "y"): []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := l.d.Adopt("m"); err != nil {
		t.Fatal(err)
	}
	held := false
	other := otherReplica(l, 0, &held)
	l.d.hooks.pruneLocked = func() {
		now := time.Now()
		for _, id := range []string{"x", "y"} {
			base := &t3rpc.ThreadShell{ID: id, Status: "idle"}
			if err := other.Track("m", store.Thread{ID: id, Machine: "m", Watch: true, CreatedAt: now, UpdatedAt: now}, base); err != nil {
				t.Error(err)
			}
		}
	}
	if _, err := l.d.Prune(); err != nil {
		t.Fatal(err)
	}
	l.d.hooks.pruneLocked = nil
	for _, id := range []string{"x", "y"} {
		l.wantWatched("m", id, "")
	}
	l.see(row("x", "running", "r2", "r2", ""))
	l.see(row("x", "completed", "", "r2", ""))
	l.see(row("y", "running", "r3", "r3", ""))
	l.see(row("y", "completed", "", "r3", ""))
	l.want("completed r2", "completed r3")
}

// TestPruneClaimsARemovedMachine: machine "gone" was removed from the configuration, so no
// replica holds its lease; its unwatched expired thread and left-over state are pruned once this
// replica's claim succeeds, in a batch fenced with the claim's token, and the claim is released
// after it. While another replica still holds it (the claim fails), nothing of it is pruned.
func TestPruneClaimsARemovedMachine(t *testing.T) {
	l := newLeaseEnv(t)
	old := time.Now().Add(-DefaultRetention - time.Hour)
	if err := l.st.Commit(store.Batch{Threads: []store.Thread{{ID: "x", Machine: "gone", CreatedAt: old, UpdatedAt: old}},
		Detector: map[string][]byte{key("gone", "x"): []byte(`{}`), key("gone", "orphan"): []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	l.setLease(0, 7) // the fake store's current token: 7, this replica holds no machine
	free, released := false, 0
	l.d.claim = func(machine string) (int64, func(), bool) {
		if machine != "gone" || !free {
			return 0, nil, false
		}
		return 7, func() { released++ }, true
	}
	left := func() (threads, states int) { return l.left("x") }
	if n, err := l.d.Prune(); err != nil || n != 0 {
		t.Fatalf("Prune while another replica holds the machine = %d, %v; want nothing", n, err)
	}
	if th, st := left(); th != 1 || st != 2 {
		t.Fatalf("%d threads and %d states left while another replica holds it, want 1 and 2", th, st)
	}
	free = true
	if n, err := l.d.Prune(); err != nil || n != 1 {
		t.Fatalf("Prune of the claimed machine = %d, %v; want 1 thread", n, err)
	}
	if th, st := left(); th != 0 || st != 0 {
		t.Fatalf("%d threads and %d states left after the claimed prune, want none", th, st)
	}
	if released != 1 {
		t.Fatalf("the claim was released %d times, want once", released)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if last := l.fences[len(l.fences)-1]; *last != (store.Fence{Machine: "gone", Token: 7}) {
		t.Fatalf("the prune was fenced with %+v, want machine gone token 7", *last)
	}
}

// left counts what is stored: whether thread is tracked (0 or 1), and every detector state.
func (l *leaseEnv) left(thread string) (threads, states int) {
	l.t.Helper()
	if _, ok, _ := l.st.GetThread(thread); ok {
		threads++
	}
	if err := l.st.ForEachDetector(func(string, []byte) error { states++; return nil }); err != nil {
		l.t.Fatal(err)
	}
	return threads, states
}
