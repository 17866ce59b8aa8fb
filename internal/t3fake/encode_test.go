package t3fake

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// TestThreadBodyMatchesAPIRoundTrip pins that the thread routes, which encode the t3rpc projection
// in place, send exactly the bytes the t3rpc→t3api round trip they replaced would send: the HTTP
// schema still accepts every record, and nothing changed on the wire.
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
	p, tail, seq, total := s.projection(th), s.projectionTail(th, 4), s.head, len(th.items)
	s.mu.Unlock()
	if total <= 4 || len(tail.TurnItems) != 4 {
		t.Fatalf("want more than one page of items: %d items, tail %d", total, len(tail.TurnItems))
	}

	full := t3api.ThreadSnapshot{SnapshotSequence: seq}
	if err := toAPI(&p, &full.Projection); err != nil {
		t.Fatal(err)
	}
	bounded := t3api.BoundedThreadSnapshot{
		SnapshotSequence:       seq,
		HistoryCursor:          t3api.NewOptNilString(historyCursor(tail.TurnItems[0].Ordinal)),
		HasMoreHistory:         t3api.NewOptBool(true),
		LatestLocalTurnOrdinal: t3api.NewOptNilInt64(tail.Runs[len(tail.Runs)-1].Ordinal),
	}
	if err := toAPI(&tail, &bounded.Projection); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want []byte
	}{
		{"/api/orchestration/threads/" + tid, encode(&full)},
		{"/api/orchestration/threads/" + tid + "/bounded", encode(&bounded)},
	} {
		r := doHTTP(t, nil, "GET", s.URL()+c.path, bearer(s.Token()), "")
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", c.path, r.status, r.body)
		}
		if !bytes.Equal([]byte(r.body), c.want) {
			t.Errorf("GET %s differs from the t3rpc→t3api round trip:\n got %.400s\nwant %.400s", c.path, r.body, c.want)
		}
	}
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
