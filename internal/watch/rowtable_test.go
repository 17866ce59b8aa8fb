package watch

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// decodedRows is every recorded and synthetic thread row, decoded, without latestVisibleMessage
// (which the watcher does not keep).
func decodedRows(t *testing.T) []t3rpc.ThreadShell {
	t.Helper()
	raws := fixtureShellRows(t)
	for _, s := range syntheticRows {
		raws = append(raws, jx.Raw(s))
	}
	out := make([]t3rpc.ThreadShell, len(raws))
	for i, raw := range raws {
		if err := out[i].Decode(jx.DecodeBytes(raw)); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		out[i].LatestVisibleMessage = t3rpc.OptNilVisibleMessage{}
	}
	return out
}

// checkTable compares every row of tab with want, by lookup and by each.
func checkTable(t *testing.T, tab *rowTable, want map[string]t3rpc.ThreadShell, when string) {
	t.Helper()
	if tab.len() != len(want) {
		t.Fatalf("%s: %d rows, want %d", when, tab.len(), len(want))
	}
	for id, w := range want {
		s, ok := tab.slot(id)
		if !ok {
			t.Fatalf("%s: %s not found", when, id)
		}
		if got := tab.shell(s); !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: %s reads\n%+v\nwant\n%+v", when, id, got, w)
		}
	}
	seen := 0
	tab.each(func(s uint32) {
		got := tab.shell(s)
		if w, ok := want[got.ID]; !ok || !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: each gives %s, which reads %+v", when, got.ID, got)
		}
		seen++
	})
	if seen != len(want) {
		t.Fatalf("%s: each gave %d rows, want %d", when, seen, len(want))
	}
}

// TestRowTableMatchesAMap puts, replaces and removes rows of every recorded and synthetic kind
// under a small set of ids, at random, and after every step compares the table with a plain map
// of the rows put. It runs with the real hash and with hash masks under which ids collide (all
// of them, or four hash values for the 40 ids), so the index's side map's inserts, lookups and
// removals in every order are checked, and with enough steps that the arena is compacted many
// times.
func TestRowTableMatchesAMap(t *testing.T) {
	rows := decodedRows(t)
	masks := map[string]uint64{ // and-ed to the hash
		"maphash":  ^uint64(0),
		"all-same": 0,
		"four":     3, // four hash values for 40 ids
	}
	for name, mask := range masks {
		t.Run(name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(1, 2))
			tab := newRowTable()
			tab.ids.SetHashMask(mask)
			want := map[string]t3rpc.ThreadShell{}
			compactions := 0
			for step := range 2000 {
				id := fmt.Sprintf("thread-%d", rnd.IntN(40))
				if rnd.IntN(4) == 0 {
					_, _, listed := tab.remove(id)
					if _, had := want[id]; listed != had {
						t.Fatalf("step %d: remove %s reports listed %v, want %v", step, id, listed, had)
					}
					delete(want, id)
				} else {
					th := rows[rnd.IntN(len(rows))]
					th.ID = id
					// A new run id most of the time, so the arena grows and is compacted.
					if th.LatestRunId.Set && !th.LatestRunId.Null {
						th.LatestRunId.Value = fmt.Sprintf("run-%d", step)
						if rnd.IntN(2) == 0 {
							th.ActiveRunId = th.LatestRunId
						}
					}
					before := len(tab.arena)
					tab.put(&th, int64(step))
					if len(tab.arena) < before {
						compactions++
					}
					want[id] = th
				}
				checkTable(t, tab, want, fmt.Sprintf("step %d", step))
			}
			if compactions == 0 {
				t.Fatal("the arena was never compacted")
			}
			if name != "maphash" && tab.ids.Clashes() == 0 {
				t.Fatal("no id went to the clash map")
			}
		})
	}
}

// TestRowTableStringsOutliveChanges: the strings a read hands out are views of the arena, which
// is only ever appended to; they must read the same after any later put, removal, slot reuse,
// compaction or snapshot.
func TestRowTableStringsOutliveChanges(t *testing.T) {
	tab := newRowTable()
	th := t3rpc.ThreadShell{ID: "thread-1", ProjectId: "project-1", Title: "Fix the flaky test", Status: "running",
		LatestRunId: t3rpc.NewOptNilString("run-1"), ActiveRunId: t3rpc.NewOptNilString("run-1")}
	tab.put(&th, 1)
	s, _ := tab.slot("thread-1")
	first := tab.shell(s)
	firstCopy := first
	firstCopy.ID, firstCopy.Title = strings.Clone(first.ID), strings.Clone(first.Title)
	firstCopy.LatestRunId.Value = strings.Clone(first.LatestRunId.Value)
	arena := &tab.arena[0]
	for i := range 5000 {
		next := th
		next.ID = fmt.Sprintf("thread-%d", i%50)
		next.Title = fmt.Sprintf("Title %d", i)
		next.LatestRunId = t3rpc.NewOptNilString(fmt.Sprintf("run-%d", i))
		tab.put(&next, int64(i))
		if i%7 == 0 {
			tab.remove(fmt.Sprintf("thread-%d", (i+3)%50))
		}
	}
	if &tab.arena[0] == arena {
		t.Fatal("the arena was never replaced (compacted or grown)")
	}
	tab.resetFor([]t3rpc.ThreadShell{th})
	if first.ID != firstCopy.ID || first.Title != firstCopy.Title || first.LatestRunId.Value != firstCopy.LatestRunId.Value {
		t.Fatalf("a handed-out row changed: %+v, was %+v", first, firstCopy)
	}
}

// TestRowTableCompactionBoundsTheArena: a thread whose every row brings a new run id appends to
// the arena; compaction keeps it within twice what is live (or the minimum), and a slot freed by
// a removal is reused with nothing of the row before (its extra neither).
func TestRowTableCompactionBoundsTheArena(t *testing.T) {
	tab := newRowTable()
	for i := range 100000 {
		th := t3rpc.ThreadShell{ID: fmt.Sprintf("thread-%d", i%100), ProjectId: "p", Title: "t", Status: "running",
			LatestRunId: t3rpc.NewOptNilString(fmt.Sprintf("run-%08d", i)), ActiveRunId: t3rpc.NewOptNilString(fmt.Sprintf("run-%08d", i))}
		tab.put(&th, int64(i))
		if len(tab.arena) > max(2*100*(len("thread-99")+1+len("run-00000000")+len("running")), minCompactAt)+len(th.LatestRunId.Value) {
			t.Fatalf("after %d rows the arena is %d bytes", i+1, len(tab.arena))
		}
	}
	odd := decodedRows(t)
	var withExtra t3rpc.ThreadShell
	for _, r := range odd {
		if r.ID == "thread-odd" {
			withExtra = r
		}
	}
	tab.put(&withExtra, 1)
	s, _ := tab.slot("thread-odd")
	if _, ok := tab.extra[s]; !ok {
		t.Fatal("the odd row has no extra")
	}
	tab.remove("thread-odd")
	if _, ok := tab.extra[s]; ok {
		t.Fatal("a removed row's extra stayed")
	}
	plain := t3rpc.ThreadShell{ID: "thread-new", ProjectId: "p", Title: "n", Status: "idle"}
	tab.put(&plain, 2)
	if s2, _ := tab.slot("thread-new"); s2 != s {
		t.Fatalf("the freed slot %d was not reused (got %d)", s, s2)
	}
	if got := tab.shell(s); !reflect.DeepEqual(got, plain) {
		t.Fatalf("the reused slot reads %+v", got)
	}
}

// TestRowHoldsNoPointers: the rows are a slice the collector does not scan only while row has no
// pointer in it (BenchmarkMarkRows100x1000); a pointerful field belongs in rowExtra.
func TestRowHoldsNoPointers(t *testing.T) {
	var walk func(reflect.Type, string)
	walk = func(typ reflect.Type, path string) {
		switch typ.Kind() {
		case reflect.Struct:
			for i := range typ.NumField() {
				walk(typ.Field(i).Type, path+"."+typ.Field(i).Name)
			}
		case reflect.Array:
			walk(typ.Elem(), path+"[]")
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		default:
			t.Errorf("row%s is a %s: the mark would scan every row", path, typ.Kind())
		}
	}
	walk(reflect.TypeFor[row](), "")
}

// TestWatcherRowsSortedAfterRemovals: Threads lists the rows by id whatever slots they took
// (slots are reused after removals, so slot order is not id order).
func TestWatcherRowsSortedAfterRemovals(t *testing.T) {
	tab := newRowTable()
	for _, id := range []string{"c", "a", "d", "b"} {
		tab.put(&t3rpc.ThreadShell{ID: id, ProjectId: "p", Status: "idle"}, 1)
	}
	tab.remove("a")
	tab.put(&t3rpc.ThreadShell{ID: "e", ProjectId: "p", Status: "idle"}, 2)
	w := New("m", nil, Options{})
	w.threads = tab
	var ids []string
	for _, th := range w.Threads() {
		ids = append(ids, th.ID)
	}
	if !sort.StringsAreSorted(ids) || strings.Join(ids, "") != "bcde" {
		t.Fatalf("Threads lists %v", ids)
	}
}
