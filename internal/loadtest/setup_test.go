package loadtest

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
)

// trackedThreads is n threads as setup writes them, ids of the connector's random form.
func trackedThreads(n int) []store.Thread {
	now := time.Now().UTC()
	out := make([]store.Thread, n)
	for i := range out {
		out[i] = store.Thread{ID: t3.NewID("thread"), Machine: fmt.Sprintf("load-%03d", i%100), ProjectID: "project-1",
			ProjectTitle: "load", Title: "Load thread", Origin: "t3code-load", Watch: true, CreatedAt: now, UpdatedAt: now}
	}
	return out
}

// TestWriteTrackedKeepsEveryThread: writeTracked reorders the batch, and every thread is in the
// state file afterwards, as given.
func TestWriteTrackedKeepsEveryThread(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	want := trackedThreads(500)
	given := slices.Clone(want)
	if err := writeTracked(st, given); err != nil {
		t.Fatal(err)
	}
	got, err := st.ListThreads()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("state holds %d threads, want %d", len(got), len(want))
	}
	byID := map[string]store.Thread{}
	for _, th := range got {
		byID[th.ID] = th
	}
	for _, w := range want {
		g, ok := byID[w.ID]
		if !ok {
			t.Fatalf("thread %s missing from the state", w.ID)
		}
		if g.Machine != w.Machine || !g.Watch || g.Origin != w.Origin {
			t.Fatalf("thread %s came back as %+v, want %+v", w.ID, g, w)
		}
	}
}

// BenchmarkWriteTracked is setup's state-file write of the tracked threads (100,000 at full
// scale): random: the ids in the order they were made, one Commit, as before 12-02; sorted:
// writeTracked.
func BenchmarkWriteTracked(b *testing.B) {
	commit := func(st store.Store, threads []store.Thread) error { return st.Commit(store.Batch{Threads: threads}) }
	for _, n := range []int{10_000, 100_000} {
		threads := trackedThreads(n)
		b.Run(fmt.Sprintf("random/%d", n), func(b *testing.B) { benchWrite(b, threads, commit) })
		b.Run(fmt.Sprintf("sorted/%d", n), func(b *testing.B) { benchWrite(b, threads, writeTracked) })
	}
}

// benchWrite times write of threads, shuffled, into a new state file per op.
func benchWrite(b *testing.B, threads []store.Thread, write func(store.Store, []store.Thread) error) {
	for b.Loop() {
		b.StopTimer()
		st, err := store.Open(filepath.Join(b.TempDir(), "state"))
		if err != nil {
			b.Fatal(err)
		}
		rand.Shuffle(len(threads), func(i, j int) { threads[i], threads[j] = threads[j], threads[i] })
		b.StartTimer()
		if err := write(st, threads); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		st.Close()
		b.StartTimer()
	}
}
