package t3_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// A bounded read with a Keep, against the fake T3 speaking the wire protocol:
// only the newest runs (and what belongs to them) are decoded, the count is
// the thread's, and the last runs render exactly as from the whole read.
func TestThreadRecentKeepAgainstFake(t *testing.T) {
	fk, err := t3fake.New(t3fake.Options{ManualSteps: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fk.Close)
	pid := fk.AddProject("api", "/src/api")
	tid := fk.AddThread(pid, "many runs", "idle")
	const runs = 12
	for i := range runs {
		if _, err := fk.StartRun(tid, fmt.Sprintf("attempt %d", i+1)); err != nil {
			t.Fatal(err)
		}
		fk.StepAll()
	}
	c, err := t3.NewClient("fake", fk.URL(), fk.Token(), t3.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	whole, err := c.ThreadRecent(ctx, tid)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.ThreadRecentKeep(ctx, tid, t3.Keep{Runs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !kept.Bounded || whole.RunCount != runs || kept.RunCount != runs {
		t.Fatalf("run counts: whole %d, kept %d", whole.RunCount, kept.RunCount)
	}
	if n := len(kept.Projection.Runs); n != 3 {
		t.Fatalf("%d runs decoded", n)
	}
	if len(kept.Projection.Messages) >= len(whole.Projection.Messages) {
		t.Fatalf("messages: %d of %d", len(kept.Projection.Messages), len(whole.Projection.Messages))
	}
	meta := threadview.Meta{Machine: "fake", Status: "idle"}
	a := threadview.New(whole.Projection).Render(meta, 3, threadview.DefaultLimits)
	b := threadview.New(kept.Projection).Render(meta, 3, threadview.DefaultLimits)
	if !reflect.DeepEqual(a.Runs, b.Runs) || !reflect.DeepEqual(a.LatestRun, b.LatestRun) || len(a.Runs) != 3 || a.Runs[2].Reply.Or("") == "" {
		t.Fatalf("rendered differently:\nwhole %+v\nkept  %+v", a.Runs, b.Runs)
	}
}

// Trimmed reads share pooled buffers (the trimmer's scratch, the output the
// generated client decodes): reads of different threads at the same time each
// decode their own thread, every time.
func TestThreadRecentKeepConcurrentReadsKeepTheirOwnBodies(t *testing.T) {
	fk, err := t3fake.New(t3fake.Options{ManualSteps: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fk.Close)
	pid := fk.AddProject("api", "/src/api")
	var tids []string
	for n := range 4 {
		tid := fk.AddThread(pid, fmt.Sprintf("thread %d", n), "idle")
		for i := range 2 + 3*n { // a different number of runs each
			if _, err := fk.StartRun(tid, fmt.Sprintf("thread %d attempt %d", n, i+1)); err != nil {
				t.Fatal(err)
			}
			fk.StepAll()
		}
		tids = append(tids, tid)
	}
	c, err := t3.NewClient("fake", fk.URL(), fk.Token(), t3.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, len(tids))
	for n, tid := range tids {
		go func() {
			for range 25 {
				rec, err := c.ThreadRecentKeep(ctx, tid, t3.Keep{Runs: 2})
				if err != nil {
					errs <- err
					return
				}
				p := rec.Projection
				want := fmt.Sprintf("thread %d attempt %d", n, 2+3*n)
				if rec.RunCount != 2+3*n || p.Thread.ID != tid || len(p.Runs) != 2 || !slices.ContainsFunc(p.Messages, func(m t3api.Message) bool { return m.Text == want }) {
					errs <- fmt.Errorf("thread %s: %d runs counted, %d kept, thread %q, no message %q", tid, rec.RunCount, len(p.Runs), p.Thread.ID, want)
					return
				}
			}
			errs <- nil
		}()
	}
	for range tids {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
