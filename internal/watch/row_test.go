package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// fixtureShellRows returns every thread row T3 sent in the recorded traffic (shell stream items
// of kind thread.updated and the rows of shell snapshots), as raw JSON.
func fixtureShellRows(t *testing.T) []jx.Raw {
	t.Helper()
	var rows []jx.Raw
	for _, v := range fixtureShellItems(t) {
		var it t3rpc.ShellStreamItem
		if it.Decode(jx.DecodeBytes(v)) != nil {
			continue
		}
		if th, ok := it.Thread.Get(); ok && it.Kind == "thread.updated" {
			rows = append(rows, encodeShell(&th))
		}
		if snap, ok := it.Snapshot.Get(); ok {
			for i := range snap.Threads {
				rows = append(rows, encodeShell(&snap.Threads[i]))
			}
			for i := range snap.ArchivedThreads {
				rows = append(rows, encodeShell(&snap.ArchivedThreads[i]))
			}
		}
	}
	return rows
}

func encodeShell(t *t3rpc.ThreadShell) jx.Raw {
	var e jx.Encoder
	t.Encode(&e)
	return jx.Raw(e.Bytes())
}

// Rows the recordings do not have: every optional field absent, a timestamp not in T3's format,
// lastError as a string and as an object, an active run other than the latest, a model with
// options, out-of-range dates that time.Date would normalise.
var syntheticRows = []string{
	`{"id":"thread-min","projectId":"p","title":"","status":"idle","lastError":null}`,
	`{"id":"thread-odd","projectId":"p","title":"Odd","status":"running","latestRunId":"run-2","activeRunId":"run-3",` +
		`"latestRunRequestedAt":"2026-11-29T08:53:27Z","latestRunStartedAt":"2026-02-30T00:00:00.000Z","latestRunCompletedAt":null,` +
		`"activityRunStatus":"running","lastError":"provider exploded","pendingRuntimeRequest":{"id":"req-1","kind":"approval","createdAt":"yesterday"},` +
		`"itemCount":0,"createdAt":"2026-11-29T08:53:27.842Z","updatedAt":"2026-11-29T08:53:27.842+01:00","archivedAt":"2026-13-01T00:00:00.000Z","deletedAt":null,` +
		`"modelSelection":{"instanceId":"codex","model":"gpt-5","options":[{"id":"effort","value":"high"}]},"runtimeMode":"full-access","interactionMode":"plan"}`,
	`{"id":"thread-err","projectId":"p","title":"Err","status":"failed","lastError":{"message":"boom","code":7},"latestRunId":"r","activeRunId":null,` +
		`"pendingRuntimeRequest":null,"itemCount":12,"createdAt":"1999-12-31T23:59:59.999Z"}`,
}

// TestRowRoundTrip stores every recorded thread row (and the synthetic ones) through the
// watcher's own chunk path and reads it back with Thread, ThreadAndWait and Threads: every field
// but latestVisibleMessage must come back exactly as it was decoded — among them all the fields
// the connector reads (id, projectId, title, modelSelection, runtimeMode, status, latestRunId,
// activeRunId, latestRunCompletedAt, pendingRuntimeRequest).
func TestRowRoundTrip(t *testing.T) {
	rows := fixtureShellRows(t)
	if len(rows) < 10 {
		t.Fatalf("only %d thread rows in the recordings", len(rows))
	}
	for _, s := range syntheticRows {
		rows = append(rows, jx.Raw(s))
	}
	kinds := map[string]bool{}
	for i, raw := range rows {
		var want t3rpc.ThreadShell
		if err := want.Decode(jx.DecodeBytes(raw)); err != nil {
			t.Fatalf("row %d: %v\n%s", i, err, raw)
		}
		if want.PendingRuntimeRequest.Set && !want.PendingRuntimeRequest.Null {
			kinds["pending"] = true
		}
		if want.LatestRunCompletedAt.Set && !want.LatestRunCompletedAt.Null {
			kinds["completed"] = true
		}
		w := New("m", nil, Options{})
		item := `{"kind":"thread.updated","sequence":` + strconv.Itoa(i+1) + `,"location":"active","thread":` + string(raw) + `}`
		if _, err := w.applyChunk(context.Background(), effectrpc.Chunk{Values: []jx.Raw{jx.Raw(item)}}); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		want.LatestVisibleMessage = t3rpc.OptNilVisibleMessage{}
		got, ok := w.Thread(want.ID)
		if !ok {
			t.Fatalf("row %d: thread %s not stored", i, want.ID)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("row %d: read back\n%+v\nwant\n%+v\nfrom %s", i, got, want, raw)
		}
		got2, _, _ := w.ThreadAndWait(want.ID)
		all := w.Threads()
		if !reflect.DeepEqual(got2, want) || len(all) != 1 || !reflect.DeepEqual(all[0], want) {
			t.Errorf("row %d: ThreadAndWait or Threads differ from Thread", i)
		}
	}
	if !kinds["pending"] || !kinds["completed"] {
		t.Errorf("the rows lack a pending request or a completed run: %v", kinds)
	}
}

// TestRowReuse checks that a thread's next row replaces every field of the one before (the row is
// reused in place), including fields that go from set to absent.
func TestRowReuse(t *testing.T) {
	w := New("m", nil, Options{})
	apply := func(seq int, raw string) {
		t.Helper()
		item := `{"kind":"thread.updated","sequence":` + strconv.Itoa(seq) + `,"location":"active","thread":` + raw + `}`
		if _, err := w.applyChunk(context.Background(), effectrpc.Chunk{Values: []jx.Raw{jx.Raw(item)}}); err != nil {
			t.Fatal(err)
		}
	}
	apply(1, strings.Replace(syntheticRows[1], `"id":"thread-odd"`, `"id":"thread-x"`, 1))
	apply(2, `{"id":"thread-x","projectId":"q","title":"Now","status":"idle","lastError":null}`)
	got, _ := w.Thread("thread-x")
	want := t3rpc.ThreadShell{ID: "thread-x", ProjectId: "q", Title: "Now", Status: "idle", LastError: jx.Raw("null")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after the second row: %+v", got)
	}
}

func TestParseMillis(t *testing.T) {
	for s, ok := range map[string]bool{
		"2026-11-29T08:53:27.842Z": true, "1970-01-01T00:00:00.000Z": true, "2024-02-29T23:59:59.999Z": true,
		"2026-02-29T00:00:00.000Z": false, "2026-11-29T24:00:00.000Z": false, "2026-11-29T08:53:27Z": false,
		"2026-11-29T08:53:27.842+01:00": false, "2026-11-29 08:53:27.842Z": false, "2026-1a-29T08:53:27.842Z": false,
	} {
		ms, got := parseMillis(s)
		if got != ok {
			t.Errorf("parseMillis(%q) ok = %v, want %v", s, got, ok)
			continue
		}
		if ok {
			r := row{stamps: [nStamps]int64{ms}}
			if back := r.stamp(0); back != s {
				t.Errorf("parseMillis(%q) formats back as %q", s, back)
			}
		}
	}
}

// BenchmarkRetainedPerThread measures the heap a watcher keeps per thread once a 1,000-thread
// snapshot (every thread with a finished run, rows from t3fake's GET /api/orchestration/shell,
// the same model as the stream's snapshot) is applied, against keeping the decoded
// t3rpc.ThreadShell of every thread, as the watcher did before the compact rows.
func BenchmarkRetainedPerThread(b *testing.B) {
	item := fakeShellSnapshotItem(b, 1000)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var rows, full float64
	b.ReportAllocs()
	for b.Loop() {
		before := heap()
		w := New("m", nil, Options{})
		if _, err := w.applyChunk(context.Background(), effectrpc.Chunk{Values: []jx.Raw{item}}); err != nil {
			b.Fatal(err)
		}
		after := heap()
		if n := len(w.Threads()); n != 1000 {
			b.Fatalf("%d threads", n)
		}
		rows += (float64(after) - float64(before)) / 1000
		runtime.KeepAlive(w)

		before = heap()
		var it t3rpc.ShellStreamItem
		if err := it.Decode(jx.DecodeBytes(item)); err != nil {
			b.Fatal(err)
		}
		kept := map[string]*t3rpc.ThreadShell{}
		for _, t := range it.Snapshot.Value.Threads {
			kept[t.ID] = &t
		}
		it = t3rpc.ShellStreamItem{}
		after = heap()
		full += (float64(after) - float64(before)) / 1000
		runtime.KeepAlive(kept)
	}
	b.ReportMetric(rows/float64(b.N), "B/thread-kept")
	b.ReportMetric(full/float64(b.N), "B/thread-fullcopy")
}

// FuzzDecodeItem: decodeItem decodes every shell item as the generated decoder does (the same
// item, or an error from both), seeded with every item of the recorded shell streams.
func FuzzDecodeItem(f *testing.F) {
	for _, v := range fixtureShellItems(f) {
		f.Add([]byte(v))
	}
	f.Add([]byte(`{"kind":"thread.updated","thread":{"id":"a","projectId":"p","title":"t","status":"idle"},"thread":{"id":"b","projectId":"p","title":"u","status":"idle"}}`))
	f.Add([]byte(`{"sequence":3,"threadId":"a"}`))
	f.Add([]byte(`{"kind":"brand-new","sequence":3,"extra":[1,{"x":null}]}`))
	f.Add([]byte(`{"kind":"thread.removed","sequence":3,"threadId":"a","location":"archive"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want t3rpc.ShellStreamItem
		wantErr := want.Decode(jx.DecodeBytes(raw))
		// Twice with one recentStrings: the row's strings new, then every one remembered.
		var rs recentStrings
		for _, pass := range []string{"first", "again"} {
			var got t3rpc.ShellStreamItem
			gotErr := decodeItem(&got, raw, &rs)
			if (wantErr == nil) != (gotErr == nil) {
				t.Fatalf("%s (%s): generated decoder says %v, decodeItem %v", raw, pass, wantErr, gotErr)
			}
			if wantErr == nil && !reflect.DeepEqual(want, got) {
				t.Fatalf("%s (%s): decodeItem gives %+v, the generated decoder %+v", raw, pass, got, want)
			}
		}
	})
}

// fixtureShellItems is every shell stream item of the recorded traffic.
func fixtureShellItems(t testing.TB) []jx.Raw {
	t.Helper()
	var items []jx.Raw
	err := filepath.WalkDir("../../testdata/t3", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var rec struct {
			Frames []struct {
				Dir  string `json:"dir"`
				Data string `json:"data"`
			} `json:"frames"`
		}
		if json.Unmarshal(b, &rec) != nil {
			return nil // not a recording with frames
		}
		for _, f := range rec.Frames {
			var m t3rpc.ServerMessage
			if f.Dir == "send" || m.Decode(jx.DecodeStr(f.Data)) != nil || !m.IsChunk() {
				continue
			}
			for _, v := range m.Chunk.Values {
				var it t3rpc.ShellStreamItem
				if it.Decode(jx.DecodeBytes(v)) == nil && it.Kind != "" && it.Kind != "event" {
					items = append(items, v)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) == 0 {
		t.Fatal("no shell items in the recordings")
	}
	return items
}

// decodeItem is written key by key: a field the schema adds to ShellStreamItem (make generate)
// and decodeItem does not know would be skipped on every item, not refused. For each field of the
// generated type, an item whose value under that key is wrong for any type (a number too large
// for int64) must be refused — decoded, not skipped.
func TestDecodeItemKnowsEveryGeneratedField(t *testing.T) {
	typ := reflect.TypeFor[t3rpc.ShellStreamItem]()
	for i := range typ.NumField() {
		key := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
		raw := `{"kind":"thread.updated",` + strconv.Quote(key) + `:123456789012345678901234567890}`
		var it t3rpc.ShellStreamItem
		if err := decodeItem(&it, []byte(raw), nil); err == nil {
			t.Errorf("decodeItem skipped %q (ShellStreamItem.%s): teach it the field (item.go)", key, typ.Field(i).Name)
		}
	}
}

// decodeShell is written key by key as well: every field of the generated ThreadShell must be
// decoded (a value wrong for any type refused), not skipped.
func TestDecodeShellKnowsEveryGeneratedField(t *testing.T) {
	typ := reflect.TypeFor[t3rpc.ThreadShell]()
	for i := range typ.NumField() {
		key := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
		raw := `{"id":"t","projectId":"p","title":"x","status":"idle",` + strconv.Quote(key) + `:123456789012345678901234567890}`
		var row t3rpc.ThreadShell
		err := decodeShell(jx.DecodeStr(raw), &row, &recentStrings{})
		if typ.Field(i).Type == reflect.TypeFor[jx.Raw]() {
			// Any JSON value is one: read, not skipped.
			if v := reflect.ValueOf(row).Field(i).Interface().(jx.Raw); err != nil || string(v) != "123456789012345678901234567890" {
				t.Errorf("decodeShell read %q (ThreadShell.%s) as %q, %v", key, typ.Field(i).Name, v, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("decodeShell skipped %q (ThreadShell.%s): teach it the field (shelldecode.go)", key, typ.Field(i).Name)
		}
	}
}

// A row decoded after another of the same thread shares the strings they have in common, and a
// string that differs is the new row's own: the rows read as decoded, whatever came before.
func TestDecodeShellSharesTheStringsOfRowsBefore(t *testing.T) {
	var rs recentStrings
	decode := func(raw string) t3rpc.ThreadShell {
		t.Helper()
		var row t3rpc.ThreadShell
		if err := decodeShell(jx.DecodeStr(raw), &row, &rs); err != nil {
			t.Fatal(err)
		}
		return row
	}
	a := decode(`{"id":"thread-1","projectId":"p","title":"Fix it","status":"running","latestRunId":"run-1","activeRunId":"run-1","updatedAt":"2026-12-01T10:00:01.000Z"}`)
	b := decode(`{"id":"thread-1","projectId":"p","title":"Fix it","status":"waiting","latestRunId":"run-1","activeRunId":null,"updatedAt":"2026-12-01T10:00:02.000Z"}`)
	if unsafe.StringData(a.ID) != unsafe.StringData(b.ID) || unsafe.StringData(a.Title) != unsafe.StringData(b.Title) ||
		unsafe.StringData(a.LatestRunId.Value) != unsafe.StringData(b.LatestRunId.Value) {
		t.Fatal("the second row of a thread did not share the strings of the first")
	}
	if b.Status != "waiting" || b.UpdatedAt.Value != "2026-12-01T10:00:02.000Z" || !b.ActiveRunId.Null || a.Status != "running" {
		t.Fatalf("rows read %+v and %+v", a, b)
	}
	// Past recentWays other values of a field, the first is forgotten, not confused.
	for i := range recentWays {
		decode(fmt.Sprintf(`{"id":"thread-%d","projectId":"p","title":"t","status":"idle"}`, i+2))
	}
	if c := decode(`{"id":"thread-1","projectId":"p","title":"Fix it","status":"idle"}`); c.ID != "thread-1" || unsafe.StringData(c.ID) == unsafe.StringData(a.ID) {
		t.Fatalf("after %d other threads: id %q, shared %v", recentWays, c.ID, unsafe.StringData(c.ID) == unsafe.StringData(a.ID))
	}
}

// TestApplyChunkLetsGoOfTheFrame: the watcher decodes every chunk's items with one decoder of its
// own (recentStrings.dec); once a chunk is applied, or refused as malformed, that decoder holds
// nothing of the chunk, whose values are slices of the connection's frame buffer.
func TestApplyChunkLetsGoOfTheFrame(t *testing.T) {
	w := New("mac", nil, Options{})
	held := func() int { return reflect.ValueOf(&w.strs.dec).Elem().FieldByName("buf").Len() }
	ctx := context.Background()
	if _, err := w.applyChunk(ctx, effectrpc.Chunk{Values: shellItems(4, 4)}); err != nil {
		t.Fatal(err)
	}
	if len(w.Threads()) != 4 {
		t.Fatalf("%d threads after a chunk of 4 rows", len(w.Threads()))
	}
	if n := held(); n != 0 {
		t.Fatalf("after a chunk: the decoder holds %d bytes of it", n)
	}
	bad := []jx.Raw{jx.Raw(`{"kind":"thread.updated","sequence":99,"thread":{"id":1}}`)}
	if _, err := w.applyChunk(ctx, effectrpc.Chunk{Values: bad}); err == nil {
		t.Fatal("a malformed row applied")
	}
	if n := held(); n != 0 {
		t.Fatalf("after a malformed chunk: the decoder holds %d bytes of it", n)
	}
}
