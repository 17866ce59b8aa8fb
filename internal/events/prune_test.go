package events

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// pruneEnv is an env whose clock stands still, with old the time of a record
// past the default retention.
func pruneEnv(t *testing.T, tracked Tracked) (e *env, now, old time.Time) {
	t.Helper()
	e = newEnv(t, "")
	if tracked != nil {
		e.d = New(Options{Store: store.NewGroup(e.st), Tracked: tracked, Read: ReaderFunc(e.read), Logger: quiet()})
	}
	now = time.Now()
	e.d.now = func() time.Time { return now }
	return e, now, now.Add(-DefaultRetention - time.Hour)
}

// leftBehind records what an earlier process left for machine m: an old
// unwatched record of thread x and the detector state of its past watch. This
// detector has no lock for m yet.
func (e *env) leftBehind(m, x string, old time.Time) {
	e.t.Helper()
	if err := e.st.Commit(store.Batch{Threads: []store.Thread{{ID: x, Machine: m, CreatedAt: old, UpdatedAt: old}},
		Detector: map[string][]byte{key(m, x): []byte(`{"run":"r0","settled":true}`)}}); err != nil {
		e.t.Fatal(err)
	}
}

// wantWatched fails unless thread x is tracked, watched on m, with a detector
// state whose latest run is run.
func (e *env) wantWatched(m, x, run string) {
	e.t.Helper()
	tr, ok, err := e.st.GetThread(x)
	if err != nil || !ok || !tr.Watch || tr.Machine != m {
		e.t.Fatalf("thread %q: %+v found=%v err=%v, want it tracked and watched on %q", x, tr, ok, err, m)
	}
	raw, ok, err := e.st.Detector(key(m, x))
	if err != nil || !ok {
		e.t.Fatalf("thread %q lost its detector baseline (found=%v err=%v)", x, ok, err)
	}
	var s seen
	if err := json.Unmarshal(raw, &s); err != nil || s.Latest != run {
		e.t.Fatalf("thread %q detector state %s (%v), want the baseline with run %q", x, raw, err, run)
	}
}

// A thread tracked while a prune runs, on a machine whose lock did not exist
// when the prune began (a process just started, no chunk of that machine
// applied yet), keeps its record and its baseline: the Track waits for the
// prune instead of being undone by its commit.
func TestPruneKeepsAThreadTrackedWhileItRuns(t *testing.T) {
	e, now, old := pruneEnv(t, nil)
	e.leftBehind("m2", "x", old)
	base := row("x", "completed", "", "r1", "")
	tracked := make(chan error, 1)
	waits := make(chan struct{}, 1)
	e.d.hooks.trackWaits = func() { waits <- struct{}{} }
	e.d.hooks.pruneLocked = func() {
		go func() {
			tracked <- e.d.Track("m2", store.Thread{ID: "x", Machine: "m2", Watch: true, CreatedAt: old, UpdatedAt: now}, &base)
		}()
		select {
		case err := <-tracked: // the Track was not held back by the prune
			tracked <- err
		case <-waits: // it waits until the prune is done
		}
	}
	if _, err := e.d.Prune(); err != nil {
		t.Fatal(err)
	}
	if err := <-tracked; err != nil {
		t.Fatal(err)
	}
	e.wantWatched("m2", "x", "r1")
}

// A prune whose second read of the tracked threads fails deletes nothing and
// says so: a thread watched again between its two passes keeps its fresh
// baseline.
func TestPruneDeletesNothingWhenItsReReadFails(t *testing.T) {
	ct := &countingTracked{}
	e, now, old := pruneEnv(t, ct)
	ct.Store = e.st
	e.leftBehind("m", "x", old)
	base := row("x", "running", "r1", "r1", "")
	e.d.hooks.pruneListed = func() {
		if err := e.d.Track("m", store.Thread{ID: "x", Machine: "m", Watch: true, CreatedAt: old, UpdatedAt: now}, &base); err != nil {
			t.Error(err)
		}
		ct.mu.Lock()
		ct.failGetOne = errors.New("read failed")
		ct.mu.Unlock()
	}
	if n, err := e.d.Prune(); err == nil || n != 0 {
		t.Fatalf("Prune = %d, %v; want 0 and the read error", n, err)
	}
	e.wantWatched("m", "x", "r1")
}

// Both passes of a prune judge a record's age alike (its last update, or its
// creation when it was never updated): a thread recorded afresh between them
// without an update time is not taken for old by the second.
func TestPruneJudgesAgeAlikeInBothPasses(t *testing.T) {
	e, now, old := pruneEnv(t, nil)
	e.leftBehind("m", "x", old)
	e.d.hooks.pruneListed = func() {
		if err := e.d.Track("m", store.Thread{ID: "x", Machine: "m", CreatedAt: now}, nil); err != nil {
			t.Error(err)
		}
	}
	if _, err := e.d.Prune(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.st.GetThread("x"); err != nil || !ok {
		t.Fatalf("thread recorded just now was pruned (found=%v err=%v)", ok, err)
	}
}
