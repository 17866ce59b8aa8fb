package outbox

import (
	"errors"
	"reflect"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

type failingCounter struct{}

func (failingCounter) Counts() (int, int, int, error) { return 0, 0, 0, errors.New("disk gone") }

// /healthz's events block: off with the reason without a hook; otherwise the pending and dead
// counts of a real store file, and a store that cannot count says so.
func TestHealth(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Commit(store.Batch{Events: []store.Event{mkEvent("a", 1), mkEvent("a", 2), mkEvent("b", 1)}}); err != nil {
		t.Fatal(err)
	}
	if errs, err := st.Record([]store.Op{{Kind: store.OpDead, ID: mkEvent("b", 1).ID, At: t0, Error: "410 Gone"}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	off := Health(st, false)["events"].(map[string]any)
	if off["enabled"] != false || off["reason"] == nil {
		t.Fatalf("without a hook: %v", off)
	}
	on := Health(st, true)["events"].(map[string]any)
	if want := map[string]any{"enabled": true, "pending": 2, "dead_letters": 1}; !reflect.DeepEqual(on, want) {
		t.Fatalf("with a hook: %v, want %v", on, want)
	}
	if bad := Health(failingCounter{}, true)["events"].(map[string]any); bad["error"] != "disk gone" {
		t.Fatalf("failing store: %v", bad)
	}
}
