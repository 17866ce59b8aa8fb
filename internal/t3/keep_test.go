package t3_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

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
