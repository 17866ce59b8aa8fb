package t3fake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// TestThreadBodyMatchesAPIRoundTrip pins that the thread routes, which encode the t3rpc projection
// in place, send exactly the bytes the t3rpc→t3api round trip they replaced would send (the whole
// read), or that the generated t3api decoder takes and gives back (/bounded, which T3 builds
// differently): the HTTP schema still accepts every record.
func TestThreadBodyMatchesAPIRoundTrip(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 4})
	pid := s.AddProject("payments", "/srv/payments")
	tid := s.AddThread(pid, "Fix the flaky test", "idle")
	for i := range 3 {
		if _, err := s.StartRun(tid, fmt.Sprintf("attempt %d", i)); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
	}
	if _, err := s.StartRun(tid, "please ask a question first"); err != nil {
		t.Fatal(err)
	}
	s.StepAll() // parked on its question: a pending runtime request in the projection

	s.mu.Lock()
	th := s.threadByID[tid]
	p, seq, total := s.projection(th), s.head, len(th.items)
	s.mu.Unlock()
	if total <= 4 {
		t.Fatalf("want more than one page of items: %d items", total)
	}

	full := t3api.ThreadSnapshot{SnapshotSequence: seq}
	if err := toAPI(&p, &full.Projection); err != nil {
		t.Fatal(err)
	}
	r := doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/"+tid, bearer(s.Token()), "")
	if want := encode(&full); r.status != 200 || !bytes.Equal([]byte(r.body), want) {
		t.Errorf("GET thread differs from the t3rpc→t3api round trip (%d):\n got %.400s\nwant %.400s", r.status, r.body, want)
	}

	// /bounded is built as T3 builds it (bounded.go, bounded_test.go), not a copy's encoding:
	// the generated t3api decoder takes it, and encodes back the same bytes but for
	// visibleTurnItems, which the schema leaves out.
	r = doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/"+tid+"/bounded", bearer(s.Token()), "")
	var bounded t3api.BoundedThreadSnapshot
	if err := bounded.Decode(jx.DecodeStr(r.body)); err != nil || r.status != 200 {
		t.Fatalf("bounded: %d %v", r.status, err)
	}
	if want := withoutProjectionField(t, []byte(r.body), "visibleTurnItems"); !bytes.Equal(encode(&bounded), want) {
		t.Errorf("GET bounded differs from its t3api round trip:\n got %.400s\nwant %.400s", encode(&bounded), want)
	}
	if len(bounded.Projection.TurnItems) < 4 || len(bounded.Projection.Runs) != 4 || bounded.SnapshotSequence != seq {
		t.Errorf("bounded: %d items, %d runs, sequence %d", len(bounded.Projection.TurnItems), len(bounded.Projection.Runs), bounded.SnapshotSequence)
	}
}

// withoutProjectionField is body with the projection's field name left out, the rest byte for byte.
func withoutProjectionField(t *testing.T, body []byte, name string) []byte {
	t.Helper()
	var out []byte
	d := jx.DecodeBytes(body)
	out = append(out, '{')
	first := true
	err := d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(append(append(out, '"'), key...), '"', ':')
		if string(key) != "projection" {
			raw, err := d.Raw()
			out = append(out, raw...)
			return err
		}
		out = append(out, '{')
		pfirst := true
		err := d.ObjBytes(func(d *jx.Decoder, key []byte) error {
			raw, err := d.Raw()
			if string(key) == name {
				return err
			}
			if !pfirst {
				out = append(out, ',')
			}
			pfirst = false
			out = append(append(append(append(out, '"'), key...), '"', ':'), raw...)
			return err
		})
		out = append(out, '}')
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '}')
}

// TestPathEscapeColons keeps the nesting of ids T3's: % first, then every colon.
func TestPathEscapeColons(t *testing.T) {
	for in, want := range map[string]string{
		"run:thread:x:ordinal:1": "run%3Athread%3Ax%3Aordinal%3A1",
		"100%:a":                 "100%25%3Aa",
		"plain":                  "plain",
	} {
		if got := pathEscapeColons(in); got != want {
			t.Errorf("pathEscapeColons(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestChunkFrameMatchesEncoder pins the hand-assembled Chunk frame to the generated encoder's bytes.
func TestChunkFrameMatchesEncoder(t *testing.T) {
	items := []queued{{raw: jx.Raw(`{"kind":"synchronized"}`)}, {raw: jx.Raw(`{"a":[1,2]}`)}, {raw: jx.Raw(`"x"`)}}
	for _, id := range []t3rpc.RequestId{t3rpc.NewStringRequestId("7"), t3rpc.NewInt64RequestId(12)} {
		for n := 0; n <= len(items); n++ {
			values := make([]jx.Raw, n)
			for i := range n {
				values[i] = items[i].raw
			}
			want := encode(t3rpc.NewChunkServerMessage(t3rpc.Chunk{Tag: "Chunk", RequestId: id, Values: values}))
			if got := chunkFrame(id, items[:n]); !bytes.Equal(got, want) {
				t.Errorf("chunkFrame(%v, %d items) = %s, want %s", id, n, got, want)
			}
		}
	}
}

// TestAddThreadWithID seeds a thread under a chosen id: it is listed like a thread.create one,
// and a taken id or an unknown project is refused.
func TestAddThreadWithID(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("payments", "/srv/payments")
	if err := s.AddThreadWithID(pid, "thread-5f0c", "Seeded"); err != nil {
		t.Fatal(err)
	}
	if st, ok := s.ThreadStatus("thread-5f0c"); !ok || st != "idle" {
		t.Fatalf("seeded thread: %q %v", st, ok)
	}
	if _, err := s.StartRun("thread-5f0c", "go"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddThreadWithID(pid, "thread-5f0c", "again"); err == nil {
		t.Error("a taken id was accepted")
	}
	if err := s.AddThreadWithID("project-nope", "thread-other", "x"); err == nil {
		t.Error("an unknown project was accepted")
	}
}

// TestShellRowsMatchGenerated pins that publishShell, which writes the thread.updated envelope
// itself and encodes the row in place, sends exactly what encoding a t3rpc.ShellStreamItem gives,
// for rows of every kind a run passes through (and an archived one).
func TestShellRowsMatchGenerated(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("payments", "/srv/payments")
	tid := s.AddThread(pid, "Fix \"the\" flaky test\n", "idle")
	for _, prompt := range []string{"attempt one", "please ask a question", "Please fail: now"} {
		if _, err := s.StartRun(tid, prompt); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
		s.mu.Lock()
		if r := s.threadByID[tid].active; r != nil {
			r.th.mu.Lock()
			s.interrupt(r, "")
			r.th.mu.Unlock()
		}
		s.mu.Unlock()
		s.StepAll()
	}
	s.mu.Lock()
	th := s.threadByID[tid]
	th.archived = true
	s.publishShell(th)
	entries := append([]logEntry(nil), s.log...)
	s.mu.Unlock()
	rows := 0
	for _, e := range entries {
		if e.shellKind != "shell:thread.updated" {
			continue
		}
		rows++
		var item t3rpc.ShellStreamItem
		if err := item.Decode(jx.DecodeBytes(e.shell)); err != nil {
			t.Fatalf("seq %d: %v\n%s", e.seq, err, e.shell)
		}
		if want := encode(&item); !bytes.Equal(e.shell, want) {
			t.Errorf("seq %d: row\n%s\nwant\n%s", e.seq, e.shell, want)
		}
		if item.Sequence.Value != e.seq {
			t.Errorf("seq %d: row says sequence %d", e.seq, item.Sequence.Value)
		}
	}
	if rows < 15 {
		t.Fatalf("only %d rows checked", rows)
	}
}

// TestEventPayloadsAreTakenAtEmit pins that an event encoded late (a thread subscription's
// replay encodes the log's events on demand) carries the record as it was when the event
// happened, not as it is now.
func TestEventPayloadsAreTakenAtEmit(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("payments", "/srv/payments")
	tid := s.AddThread(pid, "Fix the flaky test", "idle")
	if _, err := s.StartRun(tid, "attempt one"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	var runStatuses, commandStatuses []string
	s.mu.Lock()
	for i := range s.log {
		e := &s.log[i]
		if e.evType == "" {
			continue
		}
		var item t3rpc.ThreadStreamItem
		if err := item.Decode(jx.DecodeBytes(e.threadItem())); err != nil {
			t.Fatal(err)
		}
		payload := item.Event.Value.Payload
		switch e.evType {
		case "run.created", "run.updated":
			var r t3rpc.Run
			if err := r.Decode(jx.DecodeBytes(payload)); err != nil {
				t.Fatal(err)
			}
			runStatuses = append(runStatuses, r.Status)
		case "turn-item.updated":
			var it t3rpc.TurnItem
			if err := it.Decode(jx.DecodeBytes(payload)); err != nil {
				t.Fatal(err)
			}
			if it.Type == "command_execution" {
				commandStatuses = append(commandStatuses, it.Status.Value)
			}
		}
	}
	s.mu.Unlock()
	if got, want := fmt.Sprint(runStatuses), "[starting running waiting completed]"; got != want {
		t.Errorf("run statuses in the events: %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(commandStatuses), "[running completed]"; got != want {
		t.Errorf("command item statuses in the events: %s, want %s", got, want)
	}
}

// TestShellRowCacheFollowsChanges pins that the row cache (rows.go) never sends a stale part: two
// threads run interleaved (their caches move through the free list from one thread to the
// other), and between rows every cached part changes in turn (title, project, modes, model
// selection with and without options, branch, worktree, the run ids, the visible message, a last
// error). Every row must be what encoding the row with the generated encoder gives.
func TestShellRowCacheFollowsChanges(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("payments", "/srv/payments")
	a := s.AddThread(pid, "Thread \"a\"", "idle")
	b := s.AddThread(pid, "Thread b\n", "idle")
	edits := []func(sh *t3rpc.ThreadShell){
		func(sh *t3rpc.ThreadShell) { sh.Title += " (renamed)" },
		func(sh *t3rpc.ThreadShell) { sh.ProjectId = "project-other" },
		func(sh *t3rpc.ThreadShell) { sh.RuntimeMode = optStr("approval-required") },
		func(sh *t3rpc.ThreadShell) { sh.InteractionMode = t3rpc.OptString{} },
		func(sh *t3rpc.ThreadShell) {
			ms := sh.ModelSelection.Value
			ms.Options = []t3rpc.ModelOption{{ID: "effort", Value: t3rpc.NewStringModelOptionValue("high")}}
			sh.ModelSelection = t3rpc.NewOptModelSelection(ms)
		},
		func(sh *t3rpc.ThreadShell) {
			sh.ModelSelection = t3rpc.NewOptModelSelection(t3rpc.ModelSelection{InstanceId: "codex", Model: "gpt-5.1"})
		},
		func(sh *t3rpc.ThreadShell) { sh.ModelSelection = t3rpc.OptModelSelection{} },
		func(sh *t3rpc.ThreadShell) { sh.Branch = optNilStr("feature/x") },
		func(sh *t3rpc.ThreadShell) { sh.WorktreePath = optNilStr("/srv/payments-x") },
		func(sh *t3rpc.ThreadShell) { sh.LatestRunId = optNilStr(sh.LatestRunId.Value + "-other") },
		func(sh *t3rpc.ThreadShell) { sh.ActiveRunId = null() },
		func(sh *t3rpc.ThreadShell) {
			v := sh.LatestVisibleMessage.Value
			v.Text += " and more"
			sh.LatestVisibleMessage = t3rpc.NewOptNilVisibleMessage(v)
		},
		func(sh *t3rpc.ThreadShell) {
			v := sh.LatestVisibleMessage.Value
			v.UpdatedAt = optStr("2026-12-01T00:00:00.000Z")
			sh.LatestVisibleMessage = t3rpc.NewOptNilVisibleMessage(v)
		},
		func(sh *t3rpc.ThreadShell) {
			sh.LatestVisibleMessage = t3rpc.OptNilVisibleMessage{Set: true, Null: true}
		},
		func(sh *t3rpc.ThreadShell) { sh.LastError = jx.Raw(`"provider gone"`) },
		func(sh *t3rpc.ThreadShell) { sh.ActivityRunStatus = optNilStr("running") },
	}
	check := func(tid string) {
		t.Helper()
		s.mu.Lock()
		th := s.threadByID[tid]
		s.publishShell(th)
		got := s.log[len(s.log)-1].shell
		item := t3rpc.ShellStreamItem{Kind: "thread.updated", Sequence: optI64(s.head), Location: optStr("active"),
			Thread: t3rpc.NewOptThreadShell(th.shell)}
		s.mu.Unlock()
		if want := encode(&item); !bytes.Equal(got, want) {
			t.Fatalf("%s: row\n%s\nwant\n%s", tid, got, want)
		}
	}
	for round := range 3 {
		for _, tid := range []string{a, b} {
			if _, err := s.StartRun(tid, fmt.Sprintf("attempt %d on %s", round, tid)); err != nil {
				t.Fatal(err)
			}
		}
		for i, edit := range edits {
			tid := []string{a, b}[i%2]
			check(tid)
			s.mu.Lock()
			edit(&s.threadByID[tid].shell)
			s.mu.Unlock()
			check(tid)
			s.Step()
		}
		s.StepAll()
		check(a)
		check(b)
	}
}

// rowsOfStream decodes a shell stream's thread.updated items; each must be exactly what the
// generated encoder writes for what it says (a row whose block was overwritten while it still
// waited in a queue would be torn or another row), with sequences strictly increasing.
func rowsOfStream(t *testing.T, items []jx.Raw) []t3rpc.ShellStreamItem {
	t.Helper()
	var rows []t3rpc.ShellStreamItem
	var last int64
	for _, raw := range items {
		var item t3rpc.ShellStreamItem
		if err := item.Decode(jx.DecodeBytes(raw)); err != nil {
			t.Fatalf("item after sequence %d: %v\n%s", last, err, raw)
		}
		if item.Kind != "thread.updated" {
			continue
		}
		if want := encode(&item); !bytes.Equal(raw, want) {
			t.Fatalf("row after sequence %d:\n%s\nre-encoded:\n%s", last, raw, want)
		}
		if item.Sequence.Value <= last {
			t.Fatalf("row with sequence %d after %d", item.Sequence.Value, last)
		}
		last = item.Sequence.Value
		rows = append(rows, item)
	}
	return rows
}

// checkRunOrder checks each thread's row statuses follow the default script's cycle (starting,
// running ×5, waiting, completed, then the next run's starting), from wherever the stream began.
func checkRunOrder(t *testing.T, rows []t3rpc.ShellStreamItem) {
	t.Helper()
	next := map[string][]string{
		"starting": {"running"}, "running": {"running", "waiting"}, "waiting": {"completed"}, "completed": {"starting"},
	}
	prev := map[string]string{}
	for _, r := range rows {
		th := r.Thread.Value
		if p, ok := prev[th.ID]; ok && !slices.Contains(next[p], th.Status) {
			t.Fatalf("thread %s: row %d says %s after %s", th.ID, r.Sequence.Value, th.Status, p)
		}
		prev[th.ID] = th.Status
	}
}

// loadThreads adds n threads with uuid-length ids to s and returns a function that starts a
// default-script run on each and steps them all to completion (eight rows each).
func loadThreads(t *testing.T, s *Server, n int) (round func()) {
	t.Helper()
	pid := s.AddProject("payments", "/srv/payments")
	var threads []string
	for i := range n {
		tid := fmt.Sprintf("thread-%08x-1111-4222-8333-%012x", i, i)
		if err := s.AddThreadWithID(pid, tid, fmt.Sprint("Load thread ", i)); err != nil {
			t.Fatal(err)
		}
		threads = append(threads, tid)
	}
	return func() {
		t.Helper()
		for _, tid := range threads {
			if _, err := s.StartRun(tid, "Fix the flaky test in the payment service, then run the whole suite "+tid); err != nil {
				t.Fatal(err)
			}
		}
		s.StepAll()
	}
}

// replayMatches subscribes c2 to the shell after the sequence back before the head and checks
// that the replayed rows are those the live subscriber got, byte for byte.
func replayMatches(t *testing.T, s *Server, c2 *client, back int64, live []t3rpc.ShellStreamItem, liveRaw []jx.Raw) {
	t.Helper()
	s.mu.Lock()
	after := s.head - back
	s.mu.Unlock()
	replay := c2.subscribe("orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d}`, after), true)
	for len(c2.items[replay]) == 0 {
		c2.pump()
	}
	if strings.Contains(string(c2.items[replay][0]), `"kind":"snapshot"`) {
		t.Fatalf("subscribing after %d gave a snapshot, not a replay", after)
	}
	byLive := map[int64]string{}
	for _, raw := range liveRaw {
		var item t3rpc.ShellStreamItem
		if item.Decode(jx.DecodeBytes(raw)) == nil && item.Kind == "thread.updated" {
			byLive[item.Sequence.Value] = string(raw)
		}
	}
	var want []int64
	for _, r := range live {
		if r.Sequence.Value > after {
			want = append(want, r.Sequence.Value)
		}
	}
	var got []int64
	for _, raw := range c2.items[replay] {
		var item t3rpc.ShellStreamItem
		if err := item.Decode(jx.DecodeBytes(raw)); err != nil {
			t.Fatalf("replayed item: %v\n%s", err, raw)
		}
		if item.Kind != "thread.updated" {
			continue
		}
		if string(raw) != byLive[item.Sequence.Value] {
			t.Fatalf("replayed row %d:\n%s\nlive:\n%s", item.Sequence.Value, raw, byLive[item.Sequence.Value])
		}
		got = append(got, item.Sequence.Value)
	}
	if !slices.Equal(got, want) {
		t.Errorf("replay after %d: %d rows (%v…), the live subscriber's %d (%v…)", after, len(got), got[:min(5, len(got))], len(want), want[:min(5, len(want))])
	}
}

// A block of shell rows is not reused while the replay log still holds rows of it: with no
// subscriber (only the log holds rows, so blocks could be reused as soon as they are retired), a
// subscriber that resumes from the log gets every row the log lists after its cursor, whole.
func TestShellRowBlocksKeptWhileTheLogHoldsThem(t *testing.T) {
	// A replay window of 450 sequences holds ~280 rows, several blocks' worth.
	s := StartT(t, Options{ManualSteps: true, ReplayLimit: 500})
	round := loadThreads(t, s, 40)
	for range 8 {
		round()
	}
	s.mu.Lock()
	after := s.head - 450
	var want []int64
	for _, e := range s.log {
		if e.seq > after && e.shellKind == "shell:thread.updated" {
			want = append(want, e.seq)
		}
	}
	reused := s.slab.reused
	s.mu.Unlock()
	c := dial(t, s, s.Token(), nil)
	replay := c.subscribe("orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d}`, after), true)
	for len(c.items[replay]) == 0 {
		c.pump()
	}
	var got []int64
	for _, r := range rowsOfStream(t, c.items[replay]) {
		got = append(got, r.Sequence.Value)
	}
	if !slices.Equal(got, want) {
		t.Errorf("replay after %d: rows %v, the log's %v", after, got, want)
	}
	if reused == 0 {
		t.Errorf("no block reused: the test proves nothing")
	}
}

// The slab reuses a block of shell rows only once nothing can read its rows: while a subscriber
// lags (it holds its Ack back, so every row waits in its queue) and the log has long dropped
// them, and while a replaying subscriber's queue holds rows of the log, every row still reaches
// them whole and in order; once they have caught up, blocks are reused.
func TestShellRowBlocksReusedOnlyOnceSent(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, ReplayLimit: 100})
	const threads, lagRounds, rounds = 40, 6, 10
	round := loadThreads(t, s, threads)
	reused := func() int64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.slab.reused
	}
	c := dial(t, s, s.Token(), nil)
	lag := c.subscribe("orchestration.subscribeShell", `{}`, false)
	for len(c.items[lag]) == 0 { // the snapshot's Chunk; its Ack is held back
		c.pump()
	}
	for range lagRounds { // 40 × 8 rows of ~600 B per round: several blocks each
		round()
	}
	lagReused := reused()
	c.autoAck[lag] = true
	c.ack(lag)
	for i := lagRounds; i < rounds; i++ {
		round()
		c.barrier()
	}
	rows := rowsOfStream(t, c.items[lag])
	for len(rows) < rounds*threads*8 {
		c.pump()
		rows = rowsOfStream(t, c.items[lag])
	}
	checkRunOrder(t, rows)
	if len(rows) != rounds*threads*8 {
		t.Fatalf("%d rows, want %d", len(rows), rounds*threads*8)
	}
	replayMatches(t, s, dial(t, s, s.Token(), nil), 90, rows, c.items[lag])
	if n := reused(); n <= lagReused {
		t.Errorf("%d blocks reused in all (%d while the subscriber lagged): reuse never happened", n, lagReused)
	}
}

// Seeding starts a run on every thread at once, each with a row cache of its own; once they have
// settled the free list keeps at most maxFreeRows of those caches (the rest go to the GC), and
// the caches taken from it afterwards still make rows byte-equal to the generated encoder's.
func TestFreeRowCachesBounded(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("load", "/srv/load")
	threads := make([]string, 192)
	for i := range threads {
		threads[i] = s.AddThread(pid, fmt.Sprint("Load thread ", i), "idle")
		if _, err := s.StartRun(threads[i], "Fix the flaky payment test"); err != nil {
			t.Fatal(err)
		}
	}
	s.StepAll()
	s.mu.Lock()
	free := len(s.freeRows)
	from := s.head
	s.mu.Unlock()
	if free == 0 || free > 64 {
		t.Fatalf("%d row caches free after %d runs settled, want 1…64", free, len(threads))
	}
	for _, tid := range threads[:8] {
		if _, err := s.StartRun(tid, "Fix the flaky payment test again"); err != nil {
			t.Fatal(err)
		}
	}
	s.StepAll()
	s.mu.Lock()
	var rows [][]byte
	for _, e := range s.log {
		if e.seq > from && e.shellKind == "shell:thread.updated" {
			rows = append(rows, append([]byte(nil), e.shell...))
		}
	}
	s.mu.Unlock()
	if len(rows) < 8*7 {
		t.Fatalf("%d rows after the second runs", len(rows))
	}
	for _, row := range rows {
		var item t3rpc.ShellStreamItem
		if err := item.Decode(jx.DecodeBytes(row)); err != nil {
			t.Fatalf("%v\n%s", err, row)
		}
		if want := encode(&item); !bytes.Equal(row, want) {
			t.Fatalf("row from a reused cache\n%s\nwant\n%s", row, want)
		}
	}
}

// threeRuns is a fake with one thread that has had three runs ("attempt 0" to "attempt 2").
func threeRuns(t *testing.T, opts Options) (*Server, string) {
	t.Helper()
	opts.ManualSteps = true
	s := StartT(t, opts)
	tid := s.AddThread(s.AddProject("payments", "/srv/payments"), "Fix the flaky test", "idle")
	for i := range 3 {
		if _, err := s.StartRun(tid, fmt.Sprintf("attempt %d", i)); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
	}
	return s, tid
}

// lockedThread is tid's thread with the server's and the thread's locks held, as a read holds
// them, until unlock.
func lockedThread(s *Server, tid string) (th *thread, unlock func()) {
	s.mu.Lock()
	th = s.threadByID[tid]
	th.mu.Lock()
	return th, func() { th.mu.Unlock(); s.mu.Unlock() }
}

// TestEncodeProjectionIsTheCopysEncoding: the whole thread read encodes the projection straight
// from the thread's records (encodeProjection); the bytes are the copy's (projection) encoding,
// with a pending runtime request, an interrupted run and a reply in the projection.
func TestEncodeProjectionIsTheCopysEncoding(t *testing.T) {
	s, tid := threeRuns(t, Options{})
	if _, err := s.StartRun(tid, "please ask a question first"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	th, unlock := lockedThread(s, tid)
	defer unlock()
	if len(th.requests) == 0 || len(th.items) < 8 {
		t.Fatalf("want a pending request and several items: %d requests, %d items", len(th.requests), len(th.items))
	}
	p := s.projection(th)
	var e jx.Encoder
	encodeProjection(&e, th, false)
	if want := encode(&p); !bytes.Equal(e.Bytes(), want) {
		t.Errorf("encoded from the records:\n got %s\nwant %s", e.Bytes(), want)
	}
}

// TestControlPlaneShapes: with Options.ControlPlane a thread read carries an attempt and a node
// per run after the runs, in T3's projection order, with the recorded attempt's and node's keys
// in the recorded order (fixture 11); the body decodes as the one without them.
func TestControlPlaneShapes(t *testing.T) {
	var rec struct {
		Exchanges []struct {
			URL          string          `json:"url"`
			Status       int             `json:"status"`
			ResponseBody json.RawMessage `json:"responseBody"`
		} `json:"exchanges"`
	}
	b, err := os.ReadFile(filepath.Join(fixtureDir, "t3-v2-pr2829", "11-http-reads-populated.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	keysOf := func(raw []byte, part string) (projection, el []string) {
		t.Helper()
		d := jx.DecodeBytes(raw)
		err := d.Obj(func(d *jx.Decoder, k string) error {
			if k != "projection" {
				return d.Skip()
			}
			return d.Obj(func(d *jx.Decoder, k string) error {
				projection = append(projection, k)
				if k != part {
					return d.Skip()
				}
				return d.Arr(func(d *jx.Decoder) error {
					if el != nil {
						return d.Skip()
					}
					el = []string{}
					return d.Obj(func(d *jx.Decoder, k string) error { el = append(el, k); return d.Skip() })
				})
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		return projection, el
	}
	var recorded []byte
	for _, e := range rec.Exchanges {
		if e.Status == 200 && strings.Contains(e.URL, "/api/orchestration/threads/") {
			recorded = e.ResponseBody
			break
		}
	}
	var body string
	if err := json.Unmarshal(recorded, &body); err == nil {
		recorded = []byte(body) // bodies are raw text in the recordings
	}
	recOrder, recAttempt := keysOf(recorded, "attempts")
	_, recNode := keysOf(recorded, "nodes")

	read := func(controlPlane bool) []byte {
		s, tid := threeRuns(t, Options{ControlPlane: controlPlane})
		th, unlock := lockedThread(s, tid)
		defer unlock()
		var e jx.Encoder
		e.ObjStart()
		e.FieldStart("projection")
		encodeProjection(&e, th, controlPlane)
		e.ObjEnd()
		return e.Bytes()
	}
	with, without := read(true), read(false)
	order, attempt := keysOf(with, "attempts")
	_, node := keysOf(with, "nodes")
	if !slices.Equal(attempt, recAttempt) || !slices.Equal(node, recNode) {
		t.Fatalf("attempt keys %v, recorded %v; node keys %v, recorded %v", attempt, recAttempt, node, recNode)
	}
	// The fake's parts in the recorded projection's order.
	if got := slices.DeleteFunc(slices.Clone(recOrder), func(k string) bool { return !slices.Contains(order, k) }); !slices.Equal(got, order) {
		t.Fatalf("projection keys %v, recorded order %v", order, recOrder)
	}
	var a, w struct{ Projection map[string]json.RawMessage }
	if err := json.Unmarshal(with, &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(without, &a); err != nil {
		t.Fatal(err)
	}
	var attempts, runs []json.RawMessage
	_ = json.Unmarshal(w.Projection["attempts"], &attempts)
	_ = json.Unmarshal(w.Projection["runs"], &runs)
	if len(attempts) != 3 || len(runs) != 3 {
		t.Fatalf("%d attempts for %d runs", len(attempts), len(runs))
	}
	delete(w.Projection, "attempts")
	delete(w.Projection, "nodes")
	if len(w.Projection) != len(a.Projection) {
		t.Fatalf("parts %d, without control plane %d", len(w.Projection), len(a.Projection))
	}
}
