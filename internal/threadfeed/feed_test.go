package threadfeed

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-faster/jx"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const fixtureDir = "../../testdata/t3/t3-v2-pr2829"

// recording is what these tests read of a recorded fixture.
type recording struct {
	Frames []struct {
		Dir  string `json:"dir"`
		Data string `json:"data"`
	} `json:"frames"`
	Exchanges []struct {
		URL          string `json:"url"`
		Status       int    `json:"status"`
		ResponseBody string `json:"responseBody"`
	} `json:"exchanges"`
}

// message is one Effect RPC message of a frame, as far as these tests look.
type message struct {
	Tag       string            `json:"_tag"`
	ID        string            `json:"id"`
	RequestID string            `json:"requestId"`
	Method    string            `json:"tag"`
	Payload   json.RawMessage   `json:"payload"`
	Values    []json.RawMessage `json:"values"`
}

func messages(data string) []message {
	var one message
	if json.Unmarshal([]byte(data), &one) == nil && one.Tag != "" {
		return []message{one}
	}
	var many []message
	_ = json.Unmarshal([]byte(data), &many)
	return many
}

// threadStreams returns every recorded subscribeThread stream that starts
// with a snapshot (its items in order) by thread id.
func threadStreams(rec recording) map[string][][]json.RawMessage {
	threadOf := map[string]string{}
	items := map[string][]json.RawMessage{}
	var order []string
	for _, f := range rec.Frames {
		for _, m := range messages(f.Data) {
			switch {
			case f.Dir == "send" && m.Tag == "Request" && m.Method == "orchestration.subscribeThread":
				var in struct{ ThreadID string }
				_ = json.Unmarshal(m.Payload, &in)
				threadOf[m.ID] = in.ThreadID
				order = append(order, m.ID)
			case f.Dir == "recv" && m.Tag == "Chunk" && threadOf[m.RequestID] != "":
				items[m.RequestID] = append(items[m.RequestID], m.Values...)
			}
		}
	}
	out := map[string][][]json.RawMessage{}
	for _, id := range order {
		if its := items[id]; len(its) > 0 && strings.Contains(string(its[0]), `"kind":"snapshot"`) {
			out[threadOf[id]] = append(out[threadOf[id]], its)
		}
	}
	return out
}

// recordings reads every recorded fixture, by file name.
func recordings(t testing.TB) map[string]recording {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(fixtureDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("fixtures in %s: %v", fixtureDir, err)
	}
	out := map[string]recording{}
	for _, fn := range files {
		b, err := os.ReadFile(fn)
		if err != nil {
			t.Fatal(err)
		}
		var rec recording
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatalf("%s: %v", fn, err)
		}
		out[fn] = rec
	}
	return out
}

func seqOf(t *testing.T, raw []byte) int64 {
	it, err := decodeItem(raw)
	if err != nil {
		t.Fatal(err)
	}
	return it.seq
}

func render(p *t3api.ThreadProjection, runs int) mcptools.ThreadState {
	st := threadview.New(p).Render(threadview.Meta{Machine: "mac"}, 3, threadview.DefaultLimits)
	st.RunCount.SetTo(runs)
	return st
}

// TestRecordedStreamsRenderAsTheirReads: T3's own recorded thread streams,
// applied up to the sequence of each recorded read of the same thread, render
// the state that read renders (runs, run count, replies, errors, changed
// files, the question), though the feed keeps only the newest runs of its
// snapshot and builds the rest from events.
func TestRecordedStreamsRenderAsTheirReads(t *testing.T) {
	compared := 0
	for fn, rec := range recordings(t) {
		streams := threadStreams(rec)
		for _, ex := range rec.Exchanges {
			if ex.Status != 200 || !strings.Contains(ex.URL, "/api/orchestration/threads/") {
				continue
			}
			var read t3api.ThreadSnapshot
			if err := read.Decode(jx.DecodeBytes([]byte(ex.ResponseBody))); err != nil {
				t.Fatalf("%s: %v", fn, err)
			}
			for _, items := range streams[read.Projection.Thread.ID] {
				if seqOf(t, items[0]) > read.SnapshotSequence {
					continue // subscribed after the read
				}
				f := newFeed("mac", read.Projection.Thread.ID)
				for _, it := range items {
					if seqOf(t, it) > read.SnapshotSequence {
						break
					}
					if err := f.applyChunk([]jx.Raw{jx.Raw(it)}); err != nil {
						t.Fatalf("%s: %v", fn, err)
					}
				}
				want := render(&read.Projection, len(read.Projection.Runs))
				got := render(f.p, f.runs)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s, thread %s at %d: from the stream\n%+v\nfrom the read\n%+v", filepath.Base(fn), read.Projection.Thread.ID, read.SnapshotSequence, got, want)
				}
				compared++
			}
		}
	}
	t.Logf("compared %d recorded reads", compared)
	if compared < 10 {
		t.Fatalf("compared %d recorded reads with their streams; the fixtures hold more", compared)
	}
}

// rig is a fake T3 machine with a socket to it.
type rig struct {
	fake   *t3fake.Server
	client *t3.Client
	conn   *effectrpc.Conn
}

func newRig(t testing.TB, o t3fake.Options) *rig {
	t.Helper()
	fk := t3fake.StartT(t, o)
	c, err := t3.NewClient("mac", fk.URL(), fk.Token(), t3.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Handshake(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := c.DialRPC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &rig{fake: fk, client: c, conn: conn}
}

func (r *rig) dial(context.Context) (*effectrpc.Conn, error) { return r.conn, nil }

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // generous: only a broken test waits it out
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// now is the feed's projection as it is.
func now(t *testing.T, f *Feed) State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, ok := f.Await(ctx, func(*t3api.ThreadProjection) bool { return true })
	if !ok {
		t.Fatalf("feed: %v", f.Err())
	}
	return st
}

// TestFakeStreamRendersAsTheBoundedRead: at every step of scripted runs (a
// failure, a reply, a question pending), on a thread with
// earlier runs, the feed renders what the bounded read a t3_wait result made
// renders (kept like it: the newest three runs).
func TestFakeStreamRendersAsTheBoundedRead(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true, KeepRuns: -1})
	pid := r.fake.AddProject("api", "/srv/api")
	tid := r.fake.AddThread(pid, "feed", "idle")
	for _, prompt := range []string{"write the docs", "this will fail", "write the docs", "write the docs"} {
		if _, err := r.fake.StartRun(tid, prompt); err != nil {
			t.Fatal(err)
		}
		r.fake.StepAll()
	}
	pool := NewPool(10)
	f, release, ok := pool.Acquire("mac", tid, r.dial)
	if !ok {
		t.Fatal("no feed")
	}
	defer func() { release(); pool.Wait() }()
	same := func(when string) {
		t.Helper()
		var got, want mcptools.ThreadState
		eventually(t, when+": the feed to render as the read", func() bool {
			st := now(t, f)
			rec, err := r.client.ThreadRecentKeep(context.Background(), tid, t3.Keep{Runs: 3})
			if err != nil {
				t.Fatal(err)
			}
			got, want = render(st.Projection, st.Runs), render(rec.Projection, rec.RunCount)
			return reflect.DeepEqual(got, want)
		})
	}
	same("subscribed")
	for _, prompt := range []string{"this will fail", "write the docs", "ask a question first"} {
		if _, err := r.fake.StartRun(tid, prompt); err != nil {
			t.Fatal(err)
		}
		same(prompt + " started")
		for r.fake.Step() {
			same(prompt)
		}
	}
}

// TestReadyAnswersOnlyOnceTheFeedShowsIt: Ready (t3_wait's result from the feed that woke it)
// gives the projection at once when it shows what is asked, a copy the feed's next chunks do not
// change; before that, and once the feed has stopped, it says no without waiting.
func TestReadyAnswersOnlyOnceTheFeedShowsIt(t *testing.T) {
	r, f, tid, run := runFeed(t)
	completed := runCompleted(run)
	eventually(t, "the feed's snapshot", func() bool { return now(t, f).Projection != nil })
	if _, ok := f.Ready(completed); ok {
		t.Fatal("Ready answered before the run completed")
	}
	r.fake.StepAll()
	var st State
	eventually(t, "the feed to show the run completed", func() bool {
		var ok bool
		st, ok = f.Ready(completed)
		return ok
	})
	if !completed(st.Projection) || st.Runs != 1 || st.Cursor == 0 {
		t.Fatalf("Ready gave %d runs at cursor %d: %+v", st.Runs, st.Cursor, st.Projection.Runs)
	}
	items := len(st.Projection.TurnItems)
	if _, err := r.fake.StartRun(tid, "write the docs"); err != nil {
		t.Fatal(err)
	}
	r.fake.StepAll()
	eventually(t, "the feed to show the second run", func() bool { return len(now(t, f).Projection.Runs) == 2 })
	if len(st.Projection.Runs) != 1 || len(st.Projection.TurnItems) != items {
		t.Fatalf("the state Ready gave changed with the feed: %d runs, %d items (had %d)", len(st.Projection.Runs), len(st.Projection.TurnItems), items)
	}
	f.fail(errEnded)
	if _, ok := f.Ready(func(*t3api.ThreadProjection) bool { return true }); ok {
		t.Fatal("a stopped feed answered")
	}
}

// TestFeedAcknowledgesChunksItHasNotAppliedYet: a feed's chunks hold nothing durable, so the
// socket's read loop acknowledges each as it queues it (effectrpc.StreamAhead) and T3 sends the
// thread's next chunk — the one that may settle a waited run — while the feed is still busy
// (here: its lock held, as a feed waiting for a core would hold the chunk). Once the feed goes
// on, it applies what came meanwhile.
func TestFeedAcknowledgesChunksItHasNotAppliedYet(t *testing.T) {
	r, f, _, run := runFeed(t)
	settled := func() bool {
		st := r.fake.Stats()
		return st.ChunksSent > 0 && st.AcksReceived == st.ChunksSent
	}
	eventually(t, "the feed's snapshot, acknowledged", func() bool { return now(t, f).Projection != nil && settled() })
	before := r.fake.Stats().ChunksSent

	f.mu.Lock() // the feed cannot apply anything now
	locked := true
	defer func() {
		if locked {
			f.mu.Unlock()
		}
	}()
	if !r.fake.Step() {
		t.Fatal("no step")
	}
	eventually(t, "the step's chunk sent and acknowledged while the feed cannot apply it", func() bool {
		return r.fake.Stats().ChunksSent > before && settled()
	})
	f.mu.Unlock()
	locked = false

	r.fake.StepAll()
	eventually(t, "the feed to show the run completed", func() bool {
		_, ok := f.Ready(runCompleted(run))
		return ok
	})
}

// runFeed is a thread with a run started on a fake machine, and a feed of it, released (and
// its stream ended) when the test ends.
func runFeed(t *testing.T) (r *rig, f *Feed, thread, run string) {
	t.Helper()
	r = newRig(t, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	thread = r.fake.AddThread(pid, "feed", "idle")
	run, err := r.fake.StartRun(thread, "write the docs")
	if err != nil {
		t.Fatal(err)
	}
	pool := NewPool(10)
	f, release, ok := pool.Acquire("mac", thread, r.dial)
	if !ok {
		t.Fatal("no feed")
	}
	t.Cleanup(func() { release(); pool.Wait() })
	return r, f, thread, run
}

// runCompleted says whether a projection shows run completed.
func runCompleted(run string) func(*t3api.ThreadProjection) bool {
	return func(p *t3api.ThreadProjection) bool {
		for i := range p.Runs {
			if p.Runs[i].ID == run && p.Runs[i].Status == "completed" {
				return true
			}
		}
		return false
	}
}

// TestApplyOnReadTakesOnlySmallChunksWithTheLockFree: on the socket's read loop
// (effectrpc.StreamAheadOnRead) a feed applies a chunk only when it is small and its lock is
// free at once; otherwise it leaves the chunk, untouched, to its goroutine, so the read loop
// that every frame of the machine waits for is never held by a t3_thread or a big snapshot.
func TestApplyOnReadTakesOnlySmallChunksWithTheLockFree(t *testing.T) {
	// From a recorded stream of T3's: a small snapshot and a small event after it.
	var items []jx.Raw
	for _, rec := range recordings(t) {
		for _, streams := range threadStreams(rec) {
			for _, its := range streams {
				if items != nil || len(its[0]) >= onReadMax {
					continue
				}
				for _, it := range its[1:] {
					if len(it) < onReadMax/4 && strings.Contains(string(it), `"kind":"event"`) && seqOf(t, it) > seqOf(t, its[0]) {
						items = []jx.Raw{jx.Raw(its[0]), jx.Raw(it)}
						break
					}
				}
			}
		}
	}
	if items == nil {
		t.Fatal("no recorded thread stream with a small snapshot and a small event after it")
	}
	fd := newFeed("mac", "t")
	cursor := func() int64 { fd.mu.Lock(); defer fd.mu.Unlock(); return fd.cursor }

	if taken, err := fd.applyOnRead(items[:1]); !taken || err != nil {
		t.Fatalf("a small snapshot with the lock free: taken %v, %v; want taken", taken, err)
	}
	if want := seqOf(t, items[0]); cursor() != want {
		t.Fatalf("cursor %d after the snapshot, want %d", cursor(), want)
	}
	at := cursor()

	fd.mu.Lock()
	taken, err := fd.applyOnRead(items[1:2])
	fd.mu.Unlock()
	if taken || err != nil {
		t.Fatalf("with the lock held: taken %v, %v; want it left to the feed's goroutine", taken, err)
	}
	big := make([]jx.Raw, 0, onReadMax/len(items[1])+2)
	for len(big) < cap(big) {
		big = append(big, items[1])
	}
	if taken, err := fd.applyOnRead(big); taken || err != nil {
		t.Fatalf("a chunk over %d bytes: taken %v, %v; want it left to the feed's goroutine", onReadMax, taken, err)
	}
	if cursor() != at {
		t.Fatalf("cursor %d, want %d: a chunk left to the goroutine was applied", cursor(), at)
	}

	if taken, err := fd.applyOnRead(items[1:2]); !taken || err != nil {
		t.Fatalf("the event with the lock free: taken %v, %v; want taken", taken, err)
	}
	if want := seqOf(t, items[1]); cursor() != want {
		t.Fatalf("cursor %d after the event, want %d", cursor(), want)
	}
	if _, err := fd.applyOnRead([]jx.Raw{jx.Raw(`{"kind":`)}); err == nil {
		t.Fatal("an item that cannot be decoded: no error (the feed must fail, not go on with a hole)")
	}
}
