package t3

import (
	"reflect"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// What t3_thread and t3_wait show of a trimmed read is what they showed of the
// whole body: the same ThreadState for 1, 3 and 10 turns, with and without the
// pending question, on the fake's bodies, the big synthetic ones and every
// recorded thread (the run count aside: a trimmed read reports it apart, as
// Recent.RunCount).
func TestTrimmedReadRendersTheSame(t *testing.T) {
	bodies := [][]byte{bigBounded(t, 100, false), bigBounded(t, 100, true), fakeBounded(t, 40)}
	bodies = append(bodies, fixtureBounded(t)...)
	rendered := 0
	for bi, body := range bodies {
		var full t3api.BoundedThreadSnapshot
		if full.UnmarshalJSON(body) != nil {
			continue
		}
		pending := []string{""}
		for _, r := range full.Projection.RuntimeRequests {
			if r.Status == "pending" {
				pending = append(pending, r.ID)
			}
		}
		for _, turns := range []int{1, 3, 10} {
			for _, req := range pending {
				k := Keep{Runs: turns}
				meta := threadview.Meta{Machine: "m", Status: "completed"}
				if req != "" {
					k.RequestIDs, meta.PendingRequestID, meta.PendingKind = []string{req}, req, "user_input"
				}
				out, n, err := trimBounded(body, k)
				if err != nil {
					t.Fatalf("body %d: %v", bi, err)
				}
				var got t3api.BoundedThreadSnapshot
				if err := got.UnmarshalJSON(out); err != nil {
					t.Fatal(err)
				}
				want := threadview.New(&full.Projection).Render(meta, turns, threadview.DefaultLimits)
				have := threadview.New(&got.Projection).Render(meta, turns, threadview.DefaultLimits)
				if n != len(full.Projection.Runs) {
					t.Fatalf("body %d: %d runs counted of %d", bi, n, len(full.Projection.Runs))
				}
				have.RunCount = want.RunCount
				if !reflect.DeepEqual(have, want) {
					t.Fatalf("body %d, %d turns, request %q: trimmed renders\n%+v\nwhole renders\n%+v", bi, turns, req, have, want)
				}
				rendered++
			}
		}
	}
	if rendered < 20 {
		t.Fatalf("only %d renderings compared", rendered)
	}
}
