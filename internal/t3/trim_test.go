package t3

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

// bigBounded is a bounded body of a thread with runs runs (ordinals 1..runs,
// listed oldest first like T3 does, or shuffled), two messages and a
// checkpoint each, a resolved runtime request per run and one pending one,
// and the timeline rows of the newest 10 runs.
func bigBounded(t testing.TB, runs int, reversed bool) []byte {
	t.Helper()
	tid := "thread-big"
	snap := t3api.BoundedThreadSnapshot{SnapshotSequence: 7, HasMoreHistory: t3api.NewOptBool(true), HistoryCursor: t3api.NewOptNilString("c")}
	p := &snap.Projection
	p.Thread = t3api.AppThread{ID: tid, ProjectId: "project-1", Title: "Big"}
	p.UpdatedAt = t3api.NewOptString("2026-12-01T10:00:00.000Z")
	for r := 1; r <= runs; r++ {
		id := fmt.Sprintf("run-%d", r)
		rid := t3api.NewOptNilString(id)
		p.Runs = append(p.Runs, t3api.Run{ID: id, ThreadId: tid, Ordinal: int64(r), Status: "completed",
			UserMessageId: t3api.NewOptNilString(fmt.Sprintf("msg-%d", r)), CheckpointId: t3api.NewOptNilString(fmt.Sprintf("cp-%d", r))})
		p.Messages = append(p.Messages,
			t3api.Message{ID: fmt.Sprintf("msg-%d", r), RunId: rid, Role: "user", Text: fmt.Sprintf("prompt %d \"quoted\" \u00e9", r)},
			t3api.Message{ID: fmt.Sprintf("reply-%d", r), RunId: rid, Role: "assistant", Text: fmt.Sprintf("reply %d", r)})
		p.Checkpoints = append(p.Checkpoints, t3api.Checkpoint{ID: fmt.Sprintf("cp-%d", r), RunId: rid, Status: "ready", Files: []t3api.ChangedFile{{Path: fmt.Sprintf("f%d.go", r)}}})
		p.RuntimeRequests = append(p.RuntimeRequests, t3api.RuntimeRequest{ID: fmt.Sprintf("req-%d", r), Kind: "command", Status: "resolved"})
		if r > runs-10 {
			p.TurnItems = append(p.TurnItems, t3api.TurnItem{ID: id + ":a", Type: "assistant_message", RunId: rid, Ordinal: int64(r) * 10, Text: t3api.NewOptString(fmt.Sprintf("reply %d", r))})
		}
	}
	p.RuntimeRequests = append(p.RuntimeRequests, t3api.RuntimeRequest{ID: "req-open", Kind: "user_input", Status: "pending"})
	// The pending question's row, in an older run; a row of a named request; a row of no run.
	p.TurnItems = append(p.TurnItems,
		t3api.TurnItem{ID: "q-open", Type: "user_input_request", RunId: t3api.NewOptNilString(fmt.Sprintf("run-%d", max(1, runs-5))), RequestId: t3api.NewOptString("req-open"), Ordinal: int64(runs)*10 + 1,
			Questions: []t3api.Question{{ID: "which", Question: "Which database?", Options: []t3api.QuestionOption{{Label: "postgres"}}}}},
		t3api.TurnItem{ID: "q-5", Type: "approval_request", RunId: t3api.NewOptNilString("run-5"), RequestId: t3api.NewOptString("req-5"), Ordinal: int64(runs)*10 + 2},
		t3api.TurnItem{ID: "notice", Type: "system_notice", Ordinal: int64(runs)*10 + 3})
	if reversed {
		slices.Reverse(p.Runs)
		slices.Reverse(p.Messages)
	}
	b, err := snap.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ids[T any](xs []T, id func(T) string) []string {
	var out []string
	for _, x := range xs {
		out = append(out, id(x))
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// The trimmed body holds the newest runs, the named ones and what belongs to
// them, every timeline row and the thread; the count says how many runs there
// are in all. It does not depend on the order T3 lists the runs in.
func TestTrimBoundedKeeps(t *testing.T) {
	for _, reversed := range []bool{false, true} {
		body := bigBounded(t, 100, reversed)
		var full t3api.BoundedThreadSnapshot
		if err := full.UnmarshalJSON(body); err != nil {
			t.Fatal(err)
		}
		out, n, err := trimBounded(body, Keep{Runs: 3, RunIDs: []string{"run-10"}, MessageIDs: []string{"msg-20"}, RequestIDs: []string{"req-5"}})
		if err != nil {
			t.Fatal(err)
		}
		var got t3api.BoundedThreadSnapshot
		if err := got.UnmarshalJSON(out); err != nil {
			t.Fatalf("trimmed body does not decode: %v\n%s", err, out)
		}
		if err := got.Validate(); err != nil {
			t.Fatal(err)
		}
		p := got.Projection
		if n != 100 {
			t.Fatalf("runs in all = %d", n)
		}
		if want := sorted("run-98", "run-99", "run-100", "run-10", "run-20"); !reflect.DeepEqual(ids(p.Runs, func(r t3api.Run) string { return r.ID }), want) {
			t.Fatalf("runs %v", ids(p.Runs, func(r t3api.Run) string { return r.ID }))
		}
		if want := sorted("msg-98", "reply-98", "msg-99", "reply-99", "msg-100", "reply-100", "msg-10", "reply-10", "msg-20", "reply-20"); !reflect.DeepEqual(ids(p.Messages, func(m t3api.Message) string { return m.ID }), want) {
			t.Fatalf("messages %v", ids(p.Messages, func(m t3api.Message) string { return m.ID }))
		}
		if want := sorted("cp-98", "cp-99", "cp-100", "cp-10", "cp-20"); !reflect.DeepEqual(ids(p.Checkpoints, func(c t3api.Checkpoint) string { return c.ID }), want) {
			t.Fatalf("checkpoints %v", ids(p.Checkpoints, func(c t3api.Checkpoint) string { return c.ID }))
		}
		if want := sorted("req-5", "req-open"); !reflect.DeepEqual(ids(p.RuntimeRequests, func(r t3api.RuntimeRequest) string { return r.ID }), want) {
			t.Fatalf("requests %v", ids(p.RuntimeRequests, func(r t3api.RuntimeRequest) string { return r.ID }))
		}
		// Kept elements are T3's, byte for byte, in T3's order; the rest is untouched.
		fp := full.Projection
		for _, r := range p.Runs {
			i := slices.IndexFunc(fp.Runs, func(x t3api.Run) bool { return x.ID == r.ID })
			if !reflect.DeepEqual(fp.Runs[i], r) {
				t.Fatalf("run %s changed", r.ID)
			}
		}
		// The rows of the kept runs and of the kept requests (named or pending), none of another run or of no run.
		if want := sorted("run-98:a", "run-99:a", "run-100:a", "q-open", "q-5"); !reflect.DeepEqual(ids(p.TurnItems, func(it t3api.TurnItem) string { return it.ID }), want) {
			t.Fatalf("timeline rows %v", ids(p.TurnItems, func(it t3api.TurnItem) string { return it.ID }))
		}
		for _, it := range p.TurnItems {
			if i := slices.IndexFunc(fp.TurnItems, func(x t3api.TurnItem) bool { return x.ID == it.ID }); !reflect.DeepEqual(fp.TurnItems[i], it) {
				t.Fatalf("row %s changed", it.ID)
			}
		}
		if !reflect.DeepEqual(p.Thread, fp.Thread) || p.UpdatedAt != fp.UpdatedAt ||
			got.SnapshotSequence != full.SnapshotSequence || got.HistoryCursor != full.HistoryCursor || got.HasMoreHistory != full.HasMoreHistory {
			t.Fatal("untrimmed parts changed")
		}
		if reversed != (p.Runs[0].Ordinal > p.Runs[len(p.Runs)-1].Ordinal) {
			t.Fatal("runs reordered")
		}
	}
}

// Keeping more runs than there are keeps everything but resolved requests and
// rows of no run: the trimmed body decodes to what the whole body does without them.
func TestTrimBoundedKeepAll(t *testing.T) {
	body := bigBounded(t, 20, false)
	out, n, err := trimBounded(body, Keep{Runs: 50, RequestIDs: []string{}})
	if err != nil || n != 20 {
		t.Fatal(n, err)
	}
	var a, b t3api.BoundedThreadSnapshot
	if err := a.UnmarshalJSON(body); err != nil {
		t.Fatal(err)
	}
	if err := b.UnmarshalJSON(out); err != nil {
		t.Fatal(err)
	}
	// Only the resolved runtime requests go: they are neither pending nor named.
	a.Projection.RuntimeRequests = slices.DeleteFunc(a.Projection.RuntimeRequests, func(r t3api.RuntimeRequest) bool { return r.Status != "pending" })
	// And the rows of no run (bigBounded's notice): nothing looks rows up but by run or request.
	a.Projection.TurnItems = slices.DeleteFunc(a.Projection.TurnItems, func(it t3api.TurnItem) bool { return !it.RunId.Set && !it.RequestId.Set })
	if !reflect.DeepEqual(a, b) {
		t.Fatal("keep-all trim changed the body")
	}
}

// Bodies that are not a bounded snapshot are refused, never half-trimmed (the
// caller then decodes the body as it came and reports what is wrong).
func TestTrimBoundedRefusesOtherShapes(t *testing.T) {
	for _, body := range []string{``, `[]`, `{"projection":[]}`, `{"projection":{"runs":{}}}`, `{"projection":{"runs":[1]}}`, `{"projection":{"messages":[1]}}`, `{"a":1} x`, `{"projection":{"runs":[}}`} {
		if out, _, err := trimBounded([]byte(body), Keep{Runs: 1}); err == nil {
			t.Errorf("%s: not refused (%s)", body, out)
		}
	}
}

// fixtureBounded is every recorded thread read as a bounded snapshot: the
// synthetic /bounded answer and each recorded GET /threads/{id} (same
// projection shape).
func fixtureBounded(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	out = append(out, []byte(synth(t, "thread-bounded").body()))
	files, err := filepath.Glob(filepath.Join(recorded, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		for _, e := range loadFx(t, f).Exchanges {
			if e.Status == 200 && strings.Contains(e.URL, "/api/orchestration/threads/") && !strings.Contains(e.URL[strings.Index(e.URL, "/threads/")+9:], "/") {
				out = append(out, []byte(e.body()))
			}
		}
	}
	if len(out) < 5 {
		t.Fatalf("only %d recorded thread bodies", len(out))
	}
	return out
}

// Every recorded thread trims to a body that still decodes, with the newest
// run kept and the count of all runs.
func TestTrimBoundedFixtures(t *testing.T) {
	tested := 0
	defer func() {
		if tested < 5 {
			t.Fatalf("only %d recorded thread bodies decode", tested)
		}
	}()
	for i, body := range fixtureBounded(t) {
		var full t3api.BoundedThreadSnapshot
		if full.UnmarshalJSON(body) != nil {
			continue // the synthetic /bounded answer sketches its projection as a string
		}
		tested++
		out, n, err := trimBounded(body, Keep{Runs: 1})
		if err != nil {
			t.Fatalf("fixture %d: %v", i, err)
		}
		var got t3api.BoundedThreadSnapshot
		if err := got.UnmarshalJSON(out); err != nil {
			t.Fatalf("fixture %d: trimmed body does not decode: %v", i, err)
		}
		if n != len(full.Projection.Runs) || (n > 0) != (len(got.Projection.Runs) == 1) {
			t.Fatalf("fixture %d: %d runs, kept %d", i, n, len(got.Projection.Runs))
		}
		// The timeline rows kept are T3's rows of the kept run and of the pending requests, in T3's order.
		kept := map[string]bool{}
		for _, r := range got.Projection.Runs {
			kept[r.ID] = true
		}
		for _, r := range full.Projection.RuntimeRequests {
			if r.Status == "pending" {
				kept[r.ID] = true
			}
		}
		want := slices.DeleteFunc(slices.Clone(full.Projection.TurnItems), func(it t3api.TurnItem) bool {
			return !kept[it.RunId.Or("")] && !kept[it.RequestId.Or("")]
		})
		if len(want)+len(got.Projection.TurnItems) > 0 && !reflect.DeepEqual(got.Projection.TurnItems, want) {
			t.Fatalf("fixture %d: timeline rows %d, want %d of %d", i, len(got.Projection.TurnItems), len(want), len(full.Projection.TurnItems))
		}
	}
}

// The recorded projections carry parts the generated types do not have
// (attempts, nodes, provider sessions, plans, visibleTurnItems, …; most with
// an element per run): the trim leaves them out, and what it keeps decodes
// as the whole body does.
func TestTrimBoundedLeavesOutWhatNothingDecodes(t *testing.T) {
	read := map[string]bool{"thread": true, "runs": true, "runtimeRequests": true, "messages": true, "turnItems": true, "checkpoints": true, "updatedAt": true}
	dropped := 0
	for i, body := range fixtureBounded(t) {
		var full t3api.BoundedThreadSnapshot
		if full.UnmarshalJSON(body) != nil {
			continue // the synthetic /bounded answer sketches its projection as a string
		}
		var in struct{ Projection map[string]json.RawMessage }
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatal(err)
		}
		out, _, err := trimBounded(body, Keep{Runs: 1000, RequestIDs: []string{}})
		if err != nil {
			t.Fatalf("fixture %d: %v", i, err)
		}
		var got struct{ Projection map[string]json.RawMessage }
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		for k := range in.Projection {
			_, kept := got.Projection[k]
			if kept != read[k] {
				t.Errorf("fixture %d: projection key %q kept %v", i, k, kept)
			}
			if !kept {
				dropped++
			}
		}
		var trimmed t3api.BoundedThreadSnapshot
		if err := trimmed.UnmarshalJSON(out); err != nil {
			t.Fatal(err)
		}
		full.Projection.RuntimeRequests = slices.DeleteFunc(full.Projection.RuntimeRequests, func(r t3api.RuntimeRequest) bool { return r.Status != "pending" })
		full.Projection.TurnItems = slices.DeleteFunc(full.Projection.TurnItems, func(it t3api.TurnItem) bool { return !it.RunId.Set && !it.RequestId.Set })
		// And the checkpoints of no run (the scope's root): no kept run points at them.
		full.Projection.Checkpoints = slices.DeleteFunc(full.Projection.Checkpoints, func(c t3api.Checkpoint) bool { return c.RunId.Or("") == "" })
		if !reflect.DeepEqual(full, trimmed) {
			a, b := full.Projection, trimmed.Projection
			t.Errorf("fixture %d: keep-all trim decodes differently: thread %v runs %v requests %v messages %v items %v checkpoints %v updated %v rest %v", i,
				reflect.DeepEqual(a.Thread, b.Thread), reflect.DeepEqual(a.Runs, b.Runs), reflect.DeepEqual(a.RuntimeRequests, b.RuntimeRequests), reflect.DeepEqual(a.Messages, b.Messages), reflect.DeepEqual(a.TurnItems, b.TurnItems), reflect.DeepEqual(a.Checkpoints, b.Checkpoints), reflect.DeepEqual(a.UpdatedAt, b.UpdatedAt), full.SnapshotSequence == trimmed.SnapshotSequence)
		}
	}
	if dropped == 0 {
		t.Fatal("no recorded projection part was left out: the fixtures no longer show T3's other parts")
	}
}

// FuzzTrimBounded: whatever T3 sends, trimming never panics, never produces
// invalid JSON, and a body that decodes as a bounded snapshot trims to one
// that does too, with no run T3 did not send.
func FuzzTrimBounded(f *testing.F) {
	for _, b := range fixtureBounded(f) {
		f.Add(b, 1)
	}
	f.Add(bigBounded(f, 12, true), 3)
	f.Fuzz(func(t *testing.T, body []byte, runs int) {
		k := Keep{Runs: runs % 8, RunIDs: []string{"run-3"}, MessageIDs: []string{"msg-1"}, RequestIDs: []string{"req-2"}}
		out, n, err := trimBounded(body, k)
		// Streamed in pieces through a small window, the body trims the same.
		sout, sn, serr := trimStreamed(body, k, 16, 1+(runs%5+5)%5, 3, 64)
		if (err == nil) != (serr == nil) || sn != n || !bytes.Equal(sout, out) {
			t.Fatalf("streamed: %v, %d runs, %q; whole: %v, %d runs, %q", serr, sn, sout, err, n, out)
		}
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON from %q: %q", body, out)
		}
		var full t3api.BoundedThreadSnapshot
		if full.UnmarshalJSON(body) != nil {
			return
		}
		var got t3api.BoundedThreadSnapshot
		if err := got.UnmarshalJSON(out); err != nil {
			t.Fatalf("%q decodes, its trim %q does not: %v", body, out, err)
		}
		if n != len(full.Projection.Runs) || len(got.Projection.Runs) > n {
			t.Fatalf("count %d, kept %d of %d", n, len(got.Projection.Runs), len(full.Projection.Runs))
		}
		for _, r := range got.Projection.Runs {
			if !slices.ContainsFunc(full.Projection.Runs, func(x t3api.Run) bool { return reflect.DeepEqual(x, r) }) {
				t.Fatalf("run %+v not in the body", r)
			}
		}
	})
}

// BenchmarkThreadBoundedDecode is the connector's CPU for one bounded read's
// body of a thread with 100 / 1,000 / 10,000 runs (500 / 5,000 / 50,000 turn
// items at five per run): decoded whole (before) and trimmed to the newest 3
// runs then decoded (what t3_thread does now).
func BenchmarkThreadBoundedDecode(b *testing.B) {
	for _, runs := range []int{100, 1_000, 10_000} {
		body := bigBounded(b, runs, false)
		b.Run(fmt.Sprintf("items=%d/whole", runs*5), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var s t3api.BoundedThreadSnapshot
				if err := s.UnmarshalJSON(body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("items=%d/keep3", runs*5), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				out, _, err := trimBounded(body, Keep{Runs: 3})
				if err != nil {
					b.Fatal(err)
				}
				var s t3api.BoundedThreadSnapshot
				if err := s.UnmarshalJSON(out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// chunks reads r in pieces of the sizes in n, in turn: a body arriving in
// pieces that cut keys, strings, numbers and escapes anywhere.
type chunks struct {
	r io.Reader
	n []int
	k int
}

func (c *chunks) Read(p []byte) (int, error) {
	size := c.n[c.k%len(c.n)]
	c.k++
	return c.r.Read(p[:min(len(p), size)])
}

// trimStreamed is trimBoundedFrom of body arriving in pieces of the sizes in n, in a window of
// window bytes at first.
func trimStreamed(body []byte, k Keep, window int, n ...int) ([]byte, int, error) {
	return trimBoundedFrom(&chunks{r: bytes.NewReader(body), n: n}, k, window, nil)
}

// A body trimmed as it streams, in any pieces and in a window of any size, is
// trimmed exactly as the whole body is, and the window holds only what is
// still to be copied out: it stays far smaller than the body.
func TestTrimBoundedStreamed(t *testing.T) {
	keeps := []Keep{
		{Runs: 3, RunIDs: []string{"run-10"}, MessageIDs: []string{"msg-20"}, RequestIDs: []string{"req-5"}},
		{Runs: 1},
		{Runs: 50},
	}
	bodies := [][]byte{bigBounded(t, 100, false), bigBounded(t, 100, true), fakeBounded(t, 40)}
	for _, b := range fixtureBounded(t) {
		if _, _, err := trimBounded(b, Keep{Runs: 1}); err == nil {
			bodies = append(bodies, b)
		}
	}
	for bi, body := range bodies {
		for _, k := range keeps {
			want, wantRuns, err := trimBounded(body, k)
			if err != nil {
				t.Fatalf("body %d: %v", bi, err)
			}
			for _, read := range [][]int{{1}, {7, 1, 3}, {4096}, {1 << 20}} {
				for _, window := range []int{1, 64, 4096} {
					got, runs, err := trimStreamed(body, k, window, read...)
					if err != nil || runs != wantRuns || !bytes.Equal(got, want) {
						t.Fatalf("body %d, keep %+v, reads %v, window %d: %d runs, %v\n got %.300s\nwant %.300s", bi, k, read, window, runs, err, got, want)
					}
				}
			}
		}
	}
}

// The window stays small: a body of 2,000 runs with an attempt and a node
// each, as T3's (3.4 MB, 1.2 MB of it nodes nothing reads: skipFree), is
// trimmed through a window that never grows past 256 KiB, read in the sizes a
// socket gives.
func TestTrimBoundedStreamedWindowStaysSmall(t *testing.T) {
	body := fakeBounded(t, 2_000)
	w := &window{r: bytes.NewReader(body)}
	want, _, err := trimBounded(body, Keep{Runs: 3})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := trimBoundedFrom(w, Keep{Runs: 3}, 16<<10, nil)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%v", err)
	}
	if len(body) < 1<<20 || w.max > 256<<10 {
		t.Fatalf("body %d bytes read into reads of up to %d bytes", len(body), w.max)
	}
}

// window records the largest read it was asked for: the window's free room.
type window struct {
	r   io.Reader
	max int
}

func (w *window) Read(p []byte) (int, error) {
	w.max = max(w.max, cap(p))
	return w.r.Read(p)
}

// A read error in the middle of the body is returned as it is, not taken for
// a body of the wrong shape.
func TestTrimBoundedStreamedReadError(t *testing.T) {
	body := bigBounded(t, 50, false)
	broken := errors.New("connection reset")
	r := io.MultiReader(bytes.NewReader(body[:len(body)/2]), iotest.ErrReader(broken))
	if _, _, err := trimBoundedFrom(r, Keep{Runs: 3}, 0, nil); !errors.Is(err, broken) {
		t.Fatalf("err = %v", err)
	}
	if _, _, err := trimBoundedFrom(bytes.NewReader(body[:len(body)/2]), Keep{Runs: 3}, 0, nil); !errors.Is(err, errShape) {
		t.Fatalf("cut body: err = %v", err)
	}
}

// Through the client: a bounded body streams through the trim (the read keeps
// the newest runs and counts them all), and a body the trimmer refuses is read
// a second time, whole, for the generated decoder to say what is wrong with it.
func TestThreadRecentKeepStreamsAndRereadsRefusedBodies(t *testing.T) {
	good := bigBounded(t, 40, false)
	bad := []byte(`{"snapshotSequence":1,"projection":{"runs":[7]}}`)
	var reads atomic.Int32
	body := good
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		w.Header().Set("Content-Type", "application/json")
		for b := body; len(b) > 0; b = b[min(len(b), 1000):] { // in pieces, chunked
			_, _ = w.Write(b[:min(len(b), 1000)])
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	c, err := NewClient("m", srv.URL, "tok", Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.ThreadRecentKeep(tctx(t), "thread-big", Keep{Runs: 2})
	if err != nil || rec.RunCount != 40 || len(rec.Projection.Runs) != 2 || rec.Projection.Runs[1].ID != "run-40" || reads.Load() != 1 {
		t.Fatalf("good body: %v, %d runs of %d, %d reads", err, len(rec.Projection.Runs), rec.RunCount, reads.Load())
	}
	body = bad
	_, err = c.ThreadRecentKeep(tctx(t), "thread-big", Keep{Runs: 2})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBadResponse || !strings.Contains(err.Error(), `machine "m"`) || reads.Load() != 3 {
		t.Fatalf("bad body: %v (%d reads)", err, reads.Load())
	}
}

// trimBounded is trimBoundedFrom of a body held whole: the reference the
// streamed trim is checked against (TestTrimBoundedStreamed, FuzzTrimBounded)
// and what the table tests call.
func trimBounded(body []byte, k Keep) (out []byte, runs int, err error) {
	s := scanner{b: body}
	return s.trim(k, nil)
}

// Trimmers and their buffers are reused (trimmers, the caller's dst): a trim
// appends to dst, and what one trim kept (named runs, messages, requests)
// never leaks into the next trim of another body or with another Keep.
func TestTrimBoundedReusedTrimmersStartClean(t *testing.T) {
	a, b := bigBounded(t, 30, false), bigBounded(t, 12, true)
	named := Keep{Runs: 1, RunIDs: []string{"run-3"}, MessageIDs: []string{"msg-7"}, RequestIDs: []string{"req-5"}}
	plain := Keep{Runs: 2}
	want := map[string][]byte{}
	for _, c := range []struct {
		name string
		body []byte
		k    Keep
	}{{"a named", a, named}, {"a plain", a, plain}, {"b named", b, named}, {"b plain", b, plain}} {
		s, fresh := scanner{b: c.body}, newTrimmer() // no trim has used it
		fresh.k = c.k
		out, _, err := s.trimWith(fresh, nil)
		if err != nil {
			t.Fatal(err)
		}
		want[c.name] = out
	}
	dst := []byte("prefix:")
	for round := range 3 {
		for _, c := range []struct {
			name string
			body []byte
			k    Keep
		}{{"a named", a, named}, {"b plain", b, plain}, {"b named", b, named}, {"a plain", a, plain}} {
			out, _, err := trimBoundedFrom(bytes.NewReader(c.body), c.k, 0, dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(out, []byte("prefix:")) || !bytes.Equal(out[len("prefix:"):], want[c.name]) {
				t.Fatalf("round %d, %s: trimmed differently after other trims:\n%s\nwant\n%s", round, c.name, out, want[c.name])
			}
			dst = out[:len("prefix:")] // the same buffer again
		}
	}
}
