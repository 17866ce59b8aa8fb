package t3fake

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// statuses lists, in order, the shell statuses stream id reported for thread tid.
func statuses(t *testing.T, c *client, id, tid string) []string {
	var out []string
	for _, raw := range c.items[id] {
		m := asMap(t, raw)
		if m["kind"] == "thread.updated" && str(m, "thread", "id") == tid {
			if st := str(m, "thread", "status"); len(out) == 0 || out[len(out)-1] != st {
				out = append(out, st)
			}
		}
	}
	return out
}

// eventTypes lists the thread events of stream id as "type[:detail]".
func eventTypes(t *testing.T, c *client, id string) []string {
	var out []string
	for _, raw := range c.items[id] {
		m := asMap(t, raw)
		if m["kind"] != "event" {
			continue
		}
		typ := str(m, "event", "type")
		switch typ {
		case "run.created", "run.updated":
			typ += ":" + str(m, "event", "payload", "status")
		case "turn-item.updated":
			typ += ":" + str(m, "event", "payload", "type") + "/" + str(m, "event", "payload", "status")
		case "runtime-request.updated":
			typ += ":" + str(m, "event", "payload", "status")
		case "message.updated":
			typ += ":" + str(m, "event", "payload", "role")
		}
		out = append(out, typ)
	}
	return out
}

// lastEvent returns the payload of the newest event of type typ on stream id.
func lastEvent(t *testing.T, c *client, id, typ, itemType string) map[string]any {
	t.Helper()
	for i := len(c.items[id]) - 1; i >= 0; i-- {
		m := asMap(t, c.items[id][i])
		if m["kind"] == "event" && str(m, "event", "type") == typ && (itemType == "" || str(m, "event", "payload", "type") == itemType) {
			return path(m, "event", "payload").(map[string]any)
		}
	}
	t.Fatalf("no %s %s event", typ, itemType)
	return nil
}

func TestShellSubscribeAndRunToCompletion(t *testing.T) {
	s := StartT(t, Options{Label: "build-box"}) // StepDelay 0: steps as fast as possible
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)

	shell := c.subscribe("orchestration.subscribeShell", `{"requestCompletionMarker":true}`, true)
	c.waitItem(shell, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })
	if first := asMap(t, c.items[shell][0]); first["kind"] != "snapshot" || len(path(first, "snapshot", "projects").([]any)) != 1 {
		t.Fatalf("first shell item: %v", first)
	}
	if got := len(c.chunks[shell][0]); got != 1 {
		t.Errorf("snapshot chunk holds %d items, want it alone", got)
	}

	tid := "thread:a%b" // ':' and '%' as T3 ids may hold
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c-create", tid, pid)))
	th := c.subscribe("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"requestCompletionMarker":true}`, tid), true)
	c.waitItem(th, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })

	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c-run", tid, "m-1", "Summarise the repository layout for a new teammate, briefly please")))
	c.waitItem(shell, 0, isShell(tid, "completed"))
	c.waitItem(th, 0, isEvent("run.updated", "status", "completed"))

	if got, want := statuses(t, c, shell, tid), []string{"idle", "starting", "running", "waiting", "completed"}; !slices.Equal(got, want) {
		t.Errorf("shell statuses %v, want %v", got, want)
	}
	want := []string{
		"run.created:starting", "message.updated:user", "turn-item.updated:user_message/completed",
		"run.updated:running",
		"turn-item.updated:command_execution/running", "turn-item.updated:command_execution/completed",
		"turn-item.updated:file_change/completed",
		"message.updated:assistant", "turn-item.updated:assistant_message/completed",
		"run.updated:waiting",
		"checkpoint.captured", "turn-item.updated:checkpoint/completed", "run.updated:completed",
	}
	if got := eventTypes(t, c, th); !slices.Equal(got, want) {
		t.Errorf("thread events\n got %v\nwant %v", got, want)
	}
	run := lastEvent(t, c, th, "run.updated", "")
	if run["id"] != runID(tid, 1) || run["userMessageId"] != "m-1" || run["checkpointId"] == nil {
		t.Errorf("run: %v", run)
	}
	reply := lastEvent(t, c, th, "turn-item.updated", "assistant_message")
	if reply["text"] != "Done: Summarise the repository layout for a new teammate, briefly" {
		t.Errorf("reply %q", reply["text"])
	}
	cp := lastEvent(t, c, th, "checkpoint.captured", "")
	files := cp["files"].([]any)
	if len(files) != 1 || mustJSON(files[0]) != `{"additions":3,"deletions":1,"kind":"modified","path":"README.md"}` {
		t.Errorf("checkpoint files %v", files)
	}
	// The index first: waitItem appends to c.items while it waits.
	i := c.waitItem(shell, 0, isShell(tid, "completed"))
	shellRow := asMap(t, c.items[shell][i])
	if str(shellRow, "thread", "latestRunId") != runID(tid, 1) || path(shellRow, "thread", "activeRunId") != nil ||
		str(shellRow, "thread", "latestVisibleMessage", "role") != "assistant" {
		t.Errorf("completed shell row %v", shellRow["thread"])
	}

	// Sequences: one global, increasing log; every shell item shares its event's sequence.
	var last int64
	for _, raw := range c.items[th] {
		m := asMap(t, raw)
		if m["kind"] != "event" {
			continue
		}
		seq := int64(m["sequence"].(float64))
		if seq <= last {
			t.Fatalf("sequence %d after %d", seq, last)
		}
		last = seq
	}
	if last != s.Head() {
		t.Errorf("last event %d, head %d", last, s.Head())
	}

	var p t3rpc.ThreadProjection
	if err := p.Decode(jx.DecodeBytes(c.success(c.call("orchestration.getThreadProjection", fmt.Sprintf(`{"threadId":%q}`, tid))))); err != nil {
		t.Fatal(err)
	}
	if len(p.Runs) != 1 || p.Runs[0].Status != "completed" || len(p.Checkpoints) != 1 || len(p.TurnItems) != 5 || len(p.Messages) != 2 {
		t.Errorf("projection: runs %d, checkpoints %d, items %d, messages %d", len(p.Runs), len(p.Checkpoints), len(p.TurnItems), len(p.Messages))
	}
	if st, _ := s.ThreadStatus(tid); st != "completed" {
		t.Errorf("ThreadStatus %q", st)
	}
}

func TestQuestionAndRespond(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	tid := "t-q"
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1", tid, pid)))
	shell := c.subscribeReady("orchestration.subscribeShell", `{}`)
	th := c.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid))
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c2", tid, "m-1", "Ask me a QUESTION about scope")))
	if n := s.StepAll(); n != 2 {
		t.Fatalf("StepAll ran %d steps before the question, want 2 (running, ask)", n)
	}
	c.waitItem(th, 0, isEvent("turn-item.updated", "type", "user_input_request"))
	rr := lastEvent(t, c, th, "runtime-request.updated", "")
	if rr["kind"] != "user_input" || rr["status"] != "pending" {
		t.Fatalf("runtime request %v", rr)
	}
	reqID := rr["id"].(string)
	item := lastEvent(t, c, th, "turn-item.updated", "user_input_request")
	qs := item["questions"].([]any)
	if item["requestId"] != reqID || item["status"] != "waiting" || len(qs) != 2 {
		t.Fatalf("question item %v", item)
	}
	q0, q1 := qs[0].(map[string]any), qs[1].(map[string]any)
	if len(q0["options"].([]any)) != 2 || q0["multiSelect"] != nil || q1["multiSelect"] != true {
		t.Errorf("questions %v", qs)
	}
	// The index first: waitItem appends to c.items while it waits.
	i := c.waitItem(shell, 0, func(m map[string]any) bool {
		return m["kind"] == "thread.updated" && path(m, "thread", "pendingRuntimeRequest") != nil
	})
	row := asMap(t, c.items[shell][i])
	if str(row, "thread", "pendingRuntimeRequest", "id") != reqID || str(row, "thread", "pendingRuntimeRequest", "kind") != "user_input" ||
		str(row, "thread", "status") != "running" {
		t.Errorf("shell row %v", row["thread"])
	}
	if s.Step() {
		t.Fatal("a run waiting for its answer must not step")
	}

	e := failOf(t, c.call("orchestration.dispatchCommand", respondPayload("c3", tid, "request-does-not-exist")))
	if e.Tag != "OrchestrationV2DispatchCommandError" || e.Message.Value != "Runtime request request-does-not-exist was not found." {
		t.Errorf("unknown request: %s", mustJSON(&e))
	}
	c.success(c.call("orchestration.dispatchCommand", respondPayload("c4", tid, reqID)))
	s.StepAll()
	c.waitItem(th, 0, isEvent("run.updated", "status", "completed"))
	reply := lastEvent(t, c, th, "turn-item.updated", "assistant_message")
	if reply["text"] != "Done: Ask me a QUESTION about scope. Answers: checks=lint, test; scope=Workspace" {
		t.Errorf("reply %q", reply["text"])
	}
	if a, _ := s.Answers(reqID); mustJSON(a) != `{"checks":["lint","test"],"scope":["Workspace"]}` {
		t.Errorf("answers %v", a)
	}
	if got := eventTypes(t, c, th); !slices.Contains(got, "runtime-request.updated:resolved") || !slices.Contains(got, "turn-item.updated:user_input_request/completed") {
		t.Errorf("events %v", got)
	}
	c.waitItem(shell, 0, isShell(tid, "completed"))
	e = failOf(t, c.call("orchestration.dispatchCommand", respondPayload("c5", tid, reqID)))
	if e.Message.Value != "Runtime request "+reqID+" is resolved." {
		t.Errorf("second answer: %s", e.Message.Value)
	}
}

func TestHangAndInterrupt(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	tid := "t-h"
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1", tid, pid)))
	th := c.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid))
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c2", tid, "m-1", "Work forever until interrupted.")))
	s.StepAll()
	if s.Pending() != 0 {
		t.Fatal("a hanging run stays queued")
	}
	if st, _ := s.ThreadStatus(tid); st != "running" {
		t.Fatalf("status %q", st)
	}
	c.success(c.call("orchestration.dispatchCommand", interruptPayload("c4", tid, runID(tid, 1))))
	c.waitItem(th, 0, isEvent("turn-item.updated", "type", "run_interrupt_request"))
	if !s.Step() {
		t.Fatal("the interrupt result is the run's next step")
	}
	c.waitItem(th, 0, isEvent("run.updated", "status", "interrupted"))
	res := lastEvent(t, c, th, "turn-item.updated", "run_interrupt_result")
	req := lastEvent(t, c, th, "turn-item.updated", "run_interrupt_request")
	if res["status"] != "interrupted" || res["parentItemId"] != req["id"] || req["message"] != "test: stop" {
		t.Errorf("interrupt items %v / %v", req, res)
	}
	if cmd := lastEvent(t, c, th, "turn-item.updated", "command_execution"); cmd["status"] != "interrupted" {
		t.Errorf("hanging command %v", cmd)
	}
	if st, _ := s.ThreadStatus(tid); st != "interrupted" {
		t.Errorf("status %q", st)
	}
	e := failOf(t, c.call("orchestration.dispatchCommand", interruptPayload("c5", tid, runID(tid, 1))))
	if e.Message.Value != "Run "+runID(tid, 1)+" is not interruptible." || e.CommandType.Value != "run.interrupt" {
		t.Errorf("second interrupt: %s", mustJSON(&e))
	}
}

func TestFailingRun(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	c := dial(t, s, s.Token(), nil)
	th := c.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid))
	rid, err := s.StartRun(tid, "This prompt will FAIL.")
	if err != nil || rid != runID(tid, 1) {
		t.Fatalf("StartRun %q %v", rid, err)
	}
	s.StepAll()
	c.waitItem(th, 0, isEvent("run.updated", "status", "failed"))
	item := lastEvent(t, c, th, "turn-item.updated", "error")
	if item["status"] != "failed" || str(item, "failure", "class") != "provider_error" ||
		str(item, "failure", "message") != "Simulated provider failure: This prompt will FAIL." {
		t.Errorf("error item %v", item)
	}
	if st, _ := s.ThreadStatus(tid); st != "failed" {
		t.Errorf("status %q", st)
	}
}

func TestCommandIDDedupe(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	tid := "t-d"
	first := seqOf(t, c, c.call("orchestration.dispatchCommand", createThreadPayload("c1", tid, pid)))
	run := seqOf(t, c, c.call("orchestration.dispatchCommand", dispatchPayload("c2", tid, "m-1", "hello")))
	head := s.Head()
	if again := seqOf(t, c, c.call("orchestration.dispatchCommand", dispatchPayload("c2", tid, "m-1", "hello"))); again != run {
		t.Errorf("resent message.dispatch: sequence %d, want the original %d", again, run)
	}
	if again := seqOf(t, c, c.call("orchestration.dispatchCommand", createThreadPayload("c1", tid, pid))); again != first {
		t.Errorf("resent thread.create: sequence %d, want %d", again, first)
	}
	if s.Head() != head {
		t.Errorf("a resent command ran again: head %d → %d", head, s.Head())
	}
	var p t3rpc.ThreadProjection
	if err := p.Decode(jx.DecodeBytes(c.success(c.call("orchestration.getThreadProjection", fmt.Sprintf(`{"threadId":%q}`, tid))))); err != nil {
		t.Fatal(err)
	}
	if len(p.Runs) != 1 {
		t.Errorf("%d runs, want 1", len(p.Runs))
	}
	// A rejected command stays rejected.
	e := failOf(t, c.call("orchestration.dispatchCommand", interruptPayload("c3", tid, "run-does-not-exist")))
	if e.Message.Value != "Run run-does-not-exist is not interruptible." {
		t.Fatalf("%s", e.Message.Value)
	}
	e = failOf(t, c.call("orchestration.dispatchCommand", interruptPayload("c3", tid, "run-does-not-exist")))
	if !strings.HasPrefix(e.Message.Value, "Command c3 was previously rejected: Run run-does-not-exist is not interruptible.") {
		t.Errorf("replayed rejection: %s", e.Message.Value)
	}
	if got := s.Stats().CommandsAccepted; got != 4 {
		t.Errorf("CommandsAccepted %d, want 4 (2 + 2 replays)", got)
	}
}

func TestAckFlowControl(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	c := dial(t, s, s.Token(), nil)
	th := c.subscribe("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"requestCompletionMarker":true}`, tid), false)
	for len(c.chunks[th]) == 0 {
		c.pump()
	}
	if _, err := s.StartRun(tid, "plain run"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	c.barrier() // everything the server would send by now has arrived
	if n := len(c.chunks[th]); n != 1 {
		t.Fatalf("%d chunks before the first Ack, want 1", n)
	}
	if kind := asMap(t, c.chunks[th][0][0])["kind"]; kind != "snapshot" {
		t.Fatalf("first chunk %v", kind)
	}
	c.ack(th)
	for len(c.chunks[th]) < 2 {
		c.pump()
	}
	second := c.chunks[th][1]
	// Everything produced while the first Chunk waited comes batched: synchronized + 13 events.
	if len(second) != 14 || asMap(t, second[0])["kind"] != "synchronized" {
		t.Errorf("second chunk has %d items (first %v), want synchronized + 13 events", len(second), asMap(t, second[0])["kind"])
	}
	c.barrier()
	if n := len(c.chunks[th]); n != 2 {
		t.Errorf("%d chunks after one Ack, want 2", n)
	}
	if st := s.Stats(); st.AcksReceived != 1 || st.ChunksSent != 2 || st.ItemsSent != 15 {
		t.Errorf("stats %+v", st)
	}
}

func TestReplayAfterSequence(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	other := s.AddThread(pid, "other", "idle")
	after := s.Head()
	if _, err := s.StartRun(tid, "run one"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartRun(other, "run two"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	c := dial(t, s, s.Token(), nil)

	th := c.subscribe("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"afterSequence":%d,"requestCompletionMarker":true}`, tid, after), true)
	end := c.waitItem(th, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })
	if end != 13 {
		t.Errorf("%d replayed items, want the 13 events of the run", end)
	}
	last := after
	for _, raw := range c.items[th][:end] {
		m := asMap(t, raw)
		seq := int64(m["sequence"].(float64))
		if m["kind"] != "event" || str(m, "event", "threadId") != tid || seq <= last {
			t.Fatalf("replayed %v after %d", m, last)
		}
		last = seq
	}

	sh := c.subscribe("orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d,"requestCompletionMarker":true}`, after), true)
	shEnd := c.waitItem(sh, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })
	if got := statuses(t, c, sh, other); !slices.Equal(got, []string{"starting", "running", "waiting", "completed"}) {
		t.Errorf("replayed shell statuses of the other thread %v", got)
	}
	for _, raw := range c.items[sh][:shEnd] {
		if m := asMap(t, raw); m["kind"] != "thread.updated" || int64(m["sequence"].(float64)) <= after {
			t.Fatalf("replayed shell item %v", m)
		}
	}

	// Live items follow the marker.
	if _, err := s.StartRun(tid, "run three"); err != nil {
		t.Fatal(err)
	}
	c.waitItem(th, end, isEvent("run.created", "", ""))
}

func TestSnapshotFallback(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, ReplayLimit: 5})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	if _, err := s.StartRun(tid, "run"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	head := s.Head()
	first := func(c *client, method, payload string) map[string]any {
		id := c.subscribe(method, payload, true)
		c.waitItem(id, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })
		return asMap(t, c.items[id][0])
	}

	c := dial(t, s, s.Token(), nil)
	// A gap over ReplayLimit: a snapshot instead of a replay.
	m := first(c, "orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"afterSequence":%d,"requestCompletionMarker":true}`, tid, head-6))
	if m["kind"] != "snapshot" || int64(m["snapshotSequence"].(float64)) != head {
		t.Errorf("gap 6 > limit 5: %v", m["kind"])
	}
	if m := first(c, "orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d,"requestCompletionMarker":true}`, head-5)); m["kind"] != "thread.updated" {
		t.Errorf("gap 5 = limit: want a replay, got %v", m["kind"])
	}

	// A replaced database: the head goes back; every old cursor is ahead of it.
	s.Restart(head - 3)
	for {
		if _, open := <-c.in; !open {
			break // Restart dropped the socket
		}
	}
	c2 := dial(t, s, s.Token(), nil)
	m = first(c2, "orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d,"requestCompletionMarker":true}`, head))
	if m["kind"] != "snapshot" || int64(path(m, "snapshot", "snapshotSequence").(float64)) != head-3 {
		t.Errorf("after Restart(lower): %v", m)
	}
	m = first(c2, "orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"afterSequence":%d,"requestCompletionMarker":true}`, tid, head-4))
	if m["kind"] != "snapshot" {
		t.Errorf("a cursor older than the replaced log: %v", m["kind"])
	}
	// New events continue from the new head.
	id := c2.subscribe("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"afterSequence":%d}`, tid, head-3), true)
	if _, err := s.StartRun(tid, "again"); err != nil {
		t.Fatal(err)
	}
	i := c2.waitItem(id, 0, isEvent("run.created", "", ""))
	if seq := int64(asMap(t, c2.items[id][i])["sequence"].(float64)); seq != head-2 {
		t.Errorf("first event after Restart(%d) has sequence %d", head-3, seq)
	}

	// A restart to a higher head is ordinary: a cursor at the old head resumes without a snapshot.
	now := s.Head()
	s.Restart(now + 2)
	c3 := dial(t, s, s.Token(), nil)
	if m := first(c3, "orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d,"requestCompletionMarker":true}`, now)); m["kind"] != "synchronized" {
		t.Errorf("after Restart(higher): %v", m["kind"])
	}
}

func TestBatchFramesAndArrays(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, BatchFrames: true})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	c := dial(t, s, s.Token(), nil)
	// Several requests in one array frame, as Effect clients may send them; ids echo verbatim.
	c.sendRaw(`[{"_tag":"Request","id":"a","tag":"server.probe","payload":{},"headers":[]},{"_tag":"Request","id":7,"tag":"server.getConfig","payload":{},"headers":[]},{"_tag":"Eof"}]`)
	c.exit("a")
	cfg := c.exit("7")
	if _, ok := cfg.RequestId.GetInt64(); !ok {
		t.Errorf("numeric request id not echoed as a number")
	}
	var sc t3rpc.ServerConfig
	if err := sc.Decode(jx.DecodeBytes(c.success(cfg))); err != nil {
		t.Fatal(err)
	}
	usable := 0
	for _, p := range sc.Providers {
		if p.Enabled.Value && p.Status.Value == "ready" {
			usable++
			if p.InstanceId != ProviderInstance || p.Models[0].Slug != ProviderModel || len(p.Models[0].Capabilities.Value.OptionDescriptors) == 0 {
				t.Errorf("usable provider %+v", p)
			}
		}
	}
	if usable != 1 || len(sc.Providers) != 2 {
		t.Errorf("%d providers, %d usable", len(sc.Providers), usable)
	}

	// With streams stalled, two subscriptions queue their snapshots; released together, both
	// Chunks are ready at once and go out as one array frame.
	s.StallStreams(true)
	sh := c.subscribe("orchestration.subscribeShell", `{}`, true)
	th := c.subscribe("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid), true)
	c.barrier() // Pongs still flow while stalled; after them both subscriptions exist
	if len(c.chunks[sh])+len(c.chunks[th]) != 0 {
		t.Fatal("a stalled stream sent a chunk")
	}
	c.rec = &recorder{}
	s.StallStreams(false)
	for len(c.chunks[sh]) == 0 || len(c.chunks[th]) == 0 {
		c.pump()
	}
	var recv []frame
	for _, f := range c.rec.frames {
		if f.Dir == "recv" {
			recv = append(recv, f)
		}
	}
	if len(recv) != 1 || !strings.HasPrefix(recv[0].Data, "[") {
		t.Errorf("want one array frame with both chunks, got %d frames: %v", len(recv), recv)
	}
}

func TestRPCErrors(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, ReadOnlyToken: "read-only"})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	if d := dieOf(t, c.call("orchestration.doesNotExist", `{}`)); d != "Unknown request tag: orchestration.doesNotExist" {
		t.Errorf("unknown tag: %q", d)
	}
	if d := dieOf(t, c.call("orchestration.dispatchCommand", `{"type":"message.dispatch","threadId":"x"}`)); d != "Missing key\n  at [\"createdBy\"]" {
		t.Errorf("missing key: %q", d)
	}
	if d := dieOf(t, c.call("orchestration.dispatchCommand", `{"type":"thread.explode","commandId":"c","threadId":"x"}`)); !strings.HasPrefix(d, `Expected { readonly "type": "thread.create", ... } | `) {
		t.Errorf("unknown command type: %q", d)
	}
	e := failOf(t, c.call("orchestration.dispatchCommand", dispatchPayload("c1", "thread-does-not-exist", "m", "hi")))
	if e.Message.Value != "Failed to load orchestration projection for thread thread-does-not-exist." || e.CommandId.Value != "c1" {
		t.Errorf("unknown thread: %s", mustJSON(&e))
	}
	e = failOf(t, c.call("orchestration.getThreadProjection", `{"threadId":"nope"}`))
	if e.Tag != "OrchestrationV2GetThreadProjectionError" || e.ThreadId.Value != "nope" {
		t.Errorf("projection: %s", mustJSON(&e))
	}
	e = failOf(t, c.call("orchestration.subscribeThread", `{"threadId":"nope"}`))
	if e.Tag != "OrchestrationV2GetThreadProjectionError" {
		t.Errorf("subscribe unknown thread: %s", mustJSON(&e))
	}
	e = failOf(t, c.call("orchestration.dispatchCommand", `{"type":"thread.archive","commandId":"c9","threadId":"x"}`))
	if e.Tag != "OrchestrationV2DispatchCommandError" || e.CommandType.Value != "thread.archive" {
		t.Errorf("unimplemented command: %s", mustJSON(&e))
	}

	// Undecodable messages are connection-level defects; the socket keeps working.
	c.sendRaw(`not json`)
	c.sendRaw(`{"_tag":"Nope"}`)
	c.call("server.probe", `{}`)
	defects := 0
	for _, m := range c.other {
		if m.IsDefect() {
			defects++
		}
	}
	if defects != 2 {
		t.Errorf("%d defects, want 2", defects)
	}

	// Interrupting a stream ends it with an Interrupt cause, and nothing more arrives on it.
	tid := s.AddThread(pid, "t", "idle")
	sub := c.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid))
	c.sendRaw(fmt.Sprintf(`{"_tag":"Interrupt","requestId":%q,"interruptors":[]}`, sub))
	ex := c.exit(sub)
	if f, isFail := ex.Exit.GetExitFailure(); !isFail || f.Cause[0].Tag != "Interrupt" || len(f.Cause[0].FiberId) == 0 {
		t.Errorf("stream interrupt exit %s", mustJSON(&ex))
	}
	if _, err := s.StartRun(tid, "after unsubscribe"); err != nil {
		t.Fatal(err)
	}
	c.barrier()
	if n := len(c.items[sub]); n != 1 {
		t.Errorf("%d items after the interrupt, want only the snapshot", n)
	}

	ro := dial(t, s, "read-only", nil)
	for _, call := range [][2]string{
		{"orchestration.dispatchCommand", createThreadPayload("c2", "t", pid)},
		{"orchestration.launchThread", `{"commandId":"c3","creationSource":"mcp","threadId":"t","projectId":"` + pid + `","title":"x","modelSelection":{"instanceId":"codex","model":"gpt-5.6-sol"},"runtimeMode":"full-access","interactionMode":"default","workspaceStrategy":{"type":"root"}}`},
	} {
		e := failOf(t, ro.call(call[0], call[1]))
		if e.Tag != "EnvironmentAuthorizationError" || e.RequiredScope.Value != "orchestration:operate" ||
			e.Message.Value != "The authenticated token is missing required scope: orchestration:operate." {
			t.Errorf("%s with a read-only token: %s", call[0], mustJSON(&e))
		}
	}
	sh := ro.subscribe("orchestration.subscribeShell", `{}`, true) // reads work with read-only
	ro.waitItem(sh, 0, func(m map[string]any) bool { return m["kind"] == "snapshot" })
}

func TestLaunchThread(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	payload := `{"commandId":"c-launch","creationSource":"mcp","threadId":"t-l","projectId":"` + pid + `","title":"Fix CI","generateTitle":false,"modelSelection":{"instanceId":"codex","model":"gpt-5.6-sol"},"runtimeMode":"full-access","interactionMode":"default","workspaceStrategy":{"type":"root"},"initialMessage":{"text":"Launched with a first message.","attachments":[]}}`
	var res t3rpc.LaunchThreadResult
	if err := res.Decode(jx.DecodeBytes(c.success(c.call("orchestration.launchThread", payload)))); err != nil {
		t.Fatal(err)
	}
	p := res.Projection.Value
	if res.ThreadId != "t-l" || res.Resumed || len(p.Runs) != 1 || p.Runs[0].Status != "preparing" || p.Runs[0].UserMessageId.Value != "message:launch:c-launch" {
		t.Fatalf("launch result %s", mustJSON(&res))
	}
	th := c.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-l"}`)
	s.StepAll()
	c.waitItem(th, 0, isEvent("run.updated", "status", "completed"))
	if got := eventTypes(t, c, th); got[0] != "run.updated:starting" || got[1] != "run.updated:running" {
		t.Errorf("launched run events %v", got)
	}
	if err := res.Decode(jx.DecodeBytes(c.success(c.call("orchestration.launchThread", payload)))); err != nil || !res.Resumed {
		t.Errorf("retried launch: resumed=%v %v", res.Resumed, err)
	}
	e := failOf(t, c.call("orchestration.launchThread", strings.Replace(payload, "c-launch", "c-other", 1)))
	if e.Tag != "OrchestrationV2ThreadLaunchError" || e.Message.Value != "Thread t-l already exists." {
		t.Errorf("launch onto an existing thread: %s", mustJSON(&e))
	}
}

func TestSeedingAndInterruptSeeded(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("load", "/srv/load")
	var ids []string
	for i, st := range []string{"idle", "running", "completed", "failed", "interrupted", "waiting"} {
		ids = append(ids, s.AddThread(pid, fmt.Sprintf("seed %d", i), st))
	}
	for i := range 2000 {
		s.AddThread(pid, fmt.Sprintf("bulk %d", i), "completed")
	}
	c := dial(t, s, s.Token(), nil)
	sh := c.subscribeReady("orchestration.subscribeShell", `{}`)
	snap := asMap(t, c.items[sh][0])
	if n := len(path(snap, "snapshot", "threads").([]any)); n != 2006 {
		t.Fatalf("%d threads in the snapshot", n)
	}
	if st, _ := s.ThreadStatus(ids[1]); st != "running" {
		t.Fatalf("seeded status %q", st)
	}
	c.success(c.call("orchestration.dispatchCommand", interruptPayload("c1", ids[1], runID(ids[1], 1))))
	s.StepAll()
	if st, _ := s.ThreadStatus(ids[1]); st != "interrupted" {
		t.Errorf("interrupted seeded run: %q", st)
	}
	if !s.RemoveThread(ids[0]) {
		t.Fatal("RemoveThread")
	}
	i := c.waitItem(sh, 1, func(m map[string]any) bool { return m["kind"] == "thread.removed" })
	if m := asMap(t, c.items[sh][i]); m["threadId"] != ids[0] || m["location"] != "active" {
		t.Errorf("thread.removed %v", m)
	}
}

func TestModelSelectionSet(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	c := dial(t, s, s.Token(), nil)
	c.success(c.call("orchestration.dispatchCommand", fmt.Sprintf(`{"type":"thread.model-selection.set","commandId":"c1","threadId":%q,"modelSelection":{"instanceId":"codex","model":"gpt-5.6-mini","options":[{"id":"reasoningEffort","value":"low"}]}}`, tid)))
	e := failOf(t, c.call("orchestration.dispatchCommand", fmt.Sprintf(`{"type":"thread.model-selection.set","commandId":"c2","threadId":%q,"modelSelection":{"instanceId":"claudeAgent","model":"claude-opus-5"}}`, tid)))
	if !strings.Contains(e.Message.Value, "provider.switch") {
		t.Errorf("instance change: %s", e.Message.Value)
	}
	rid, err := s.StartRun(tid, "go")
	if err != nil {
		t.Fatal(err)
	}
	var p t3rpc.ThreadProjection
	if err := p.Decode(jx.DecodeBytes(c.success(c.call("orchestration.getThreadProjection", fmt.Sprintf(`{"threadId":%q}`, tid))))); err != nil {
		t.Fatal(err)
	}
	if p.Thread.ModelSelection.Value.Model != "gpt-5.6-mini" || p.Runs[0].ID != rid || p.Runs[0].ModelSelection.Value.Model != "gpt-5.6-mini" {
		t.Errorf("model not applied: %s", mustJSON(&p.Thread))
	}
}

func TestScriptChoice(t *testing.T) {
	for prompt, want := range map[string]string{
		"hello":             "default",
		"Ask me a Question": "question",
		"any questions?":    "question",
		"Work FOREVER":      "hang",
		"this hangs":        "hang",
		"failing test":      "fail",
		"unfailing":/* not a prefix */ "default",
		"Approve it first": "approval",
		"needs permission": "approval",
		"Elicit a form":    "elicitation",
		"a stale request":  "stale",
	} {
		if got := ScriptFor(prompt); got != want {
			t.Errorf("ScriptFor(%q) = %s, want %s", prompt, got, want)
		}
	}
	if len(Scripts) != 7 || Scripts[0].Name != "default" {
		t.Errorf("Scripts %v", Scripts)
	}
}

// TestPromptFactsFollowThePrompt: the server's facts of a prompt (its script, its excerpt) are
// that prompt's whatever came before: the same prompt again, another, an equal prompt in another
// string, and the empty prompt first.
func TestPromptFactsFollowThePrompt(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	s.mu.Lock()
	defer s.mu.Unlock()
	long := "Fix the flaky test in the payment service: the retry loop asserts before the ledger has settled"
	for i, prompt := range []string{"", "hello", "hello", "Work FOREVER", "hello", "failing test", "failing test",
		string([]byte("Work FOREVER")), long, long, "", "Ask me a Question"} {
		f := s.facts(prompt)
		if want := chooseScript(prompt); f.kind != want {
			t.Errorf("call %d: facts(%q) say script %v, want %v", i, prompt, f.kind, want)
		}
		if want := excerpt(prompt, 60); f.excerpt != want {
			t.Errorf("call %d: facts(%q) excerpt %q, want %q", i, prompt, f.excerpt, want)
		}
	}
}

func TestRetentionBounds(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, KeepRuns: 2})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	for i := range 5 {
		if _, err := s.StartRun(tid, fmt.Sprintf("run %d", i)); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
	}
	c := dial(t, s, s.Token(), nil)
	var p t3rpc.ThreadProjection
	if err := p.Decode(jx.DecodeBytes(c.success(c.call("orchestration.getThreadProjection", fmt.Sprintf(`{"threadId":%q}`, tid))))); err != nil {
		t.Fatal(err)
	}
	if len(p.Runs) != 2 || p.Runs[0].ID != runID(tid, 4) || p.Runs[1].ID != runID(tid, 5) {
		t.Fatalf("kept runs %s", mustJSON(&p))
	}
	for _, it := range p.TurnItems {
		if it.RunId.Value != runID(tid, 4) && it.RunId.Value != runID(tid, 5) {
			t.Errorf("item of a pruned run: %s", it.ID)
		}
	}
	if len(p.TurnItems) != 10 || len(p.Messages) != 4 || len(p.Checkpoints) != 2 {
		t.Errorf("items %d, messages %d, checkpoints %d", len(p.TurnItems), len(p.Messages), len(p.Checkpoints))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range maxReceipts + maxReceipts/10 + 1 {
		s.remember(fmt.Sprint("c", i), receipt{})
	}
	if _, kept := s.receipts["c0"]; kept || len(s.receipts) != maxReceipts || len(s.receiptIDs) != maxReceipts {
		t.Errorf("receipts %d (ids %d), oldest kept %v", len(s.receipts), len(s.receiptIDs), kept)
	}
}

func TestInterruptPendingQuestionAndCreateEdges(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	e := failOf(t, c.call("orchestration.dispatchCommand", createThreadPayload("c0", "t-x", "project-nope")))
	if e.Message.Value != "Project project-nope was not found." {
		t.Errorf("unknown project: %s", e.Message.Value)
	}
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1", "t-q", pid)))
	// Recorded: thread.create on an existing id is accepted and only re-announces the thread.
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1b", "t-q", pid)))
	if ids := s.ThreadIDs(); !slices.Equal(ids, []string{"t-q"}) {
		t.Errorf("threads %v", ids)
	}
	th := c.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-q"}`)
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c2", "t-q", "m-1", "a question, then stop")))
	s.StepAll()
	i := c.waitItem(th, 0, isEvent("runtime-request.updated", "status", "pending"))
	reqID := str(asMap(t, c.items[th][i]), "event", "payload", "id")
	c.success(c.call("orchestration.dispatchCommand", interruptPayload("c3", "t-q", runID("t-q", 1))))
	e = failOf(t, c.call("orchestration.dispatchCommand", respondPayload("c4", "t-q", reqID)))
	if e.Message.Value != "Runtime request "+reqID+" is cancelled." {
		t.Errorf("answer during the interrupt: %s", e.Message.Value)
	}
	s.StepAll()
	c.waitItem(th, 0, isEvent("run.updated", "status", "interrupted"))
	if rr := lastEvent(t, c, th, "runtime-request.updated", ""); rr["status"] != "cancelled" {
		t.Errorf("request after the interrupt %v", rr)
	}
	if st, _ := s.ThreadStatus("t-q"); st != "interrupted" {
		t.Errorf("status %q", st)
	}
	if _, answered := s.Answers(reqID); answered {
		t.Error("a cancelled request has answers")
	}
}

// A busy thread queues what is dispatched to it (fixture 21): the row's status
// follows the newest run (queued while run 1 runs; cancelled once the newest
// queued run is cancelled), and after run 1 is interrupted the queued runs
// start by themselves.
func TestBusyThreadQueues(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	tid := "t-busy"
	shell := c.subscribeReady("orchestration.subscribeShell", `{"requestCompletionMarker":true}`)
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1", tid, pid)))
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c2", tid, "m-1", "Work forever until interrupted.")))
	s.StepAll()
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c3", tid, "m-2", "Second, queued.")))
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c4", tid, "m-3", "Third, queued then cancelled.")))
	row := func(status string, active, latest int) func(map[string]any) bool {
		return func(m map[string]any) bool {
			th, _ := m["thread"].(map[string]any)
			if th == nil || th["id"] != tid || th["status"] != status || th["latestRunId"] != runID(tid, latest) {
				return false
			}
			if active == 0 {
				return th["activeRunId"] == nil
			}
			return th["activeRunId"] == runID(tid, active)
		}
	}
	c.waitItem(shell, 0, row("queued", 1, 3))
	e := failOf(t, c.call("orchestration.dispatchCommand", interruptPayload("c5", tid, runID(tid, 2))))
	if !strings.Contains(e.Message.Value, "is not interruptible") {
		t.Errorf("interrupting a queued run: %s", e.Message.Value)
	}
	c.success(c.call("orchestration.dispatchCommand", fmt.Sprintf(`{"type":"queued-run.cancel","commandId":"c6","threadId":%q,"runId":%q}`, tid, runID(tid, 3))))
	c.waitItem(shell, 0, row("cancelled", 1, 3))
	c.success(c.call("orchestration.dispatchCommand", interruptPayload("c7", tid, runID(tid, 1))))
	s.StepAll() // run 1 interrupted; run 2 starts and completes
	c.waitItem(shell, 0, row("cancelled", 2, 3))
	if st, _ := s.ThreadStatus(tid); st != "cancelled" {
		t.Errorf("row status %q at the end, want cancelled (the newest run's)", st)
	}
	c.waitItem(shell, 0, row("cancelled", 0, 3))
}

// A refused dispatch (RefuseDispatch) fails with T3's typed error and starts nothing.
func TestRefuseDispatch(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1", "t-r", pid)))
	s.RefuseDispatch("Provider instance codex cannot accept messages.")
	e := failOf(t, c.call("orchestration.dispatchCommand", dispatchPayload("c2", "t-r", "m-1", "hello")))
	if e.Tag != "OrchestrationV2DispatchCommandError" || e.Message.Value != "Provider instance codex cannot accept messages." {
		t.Errorf("refusal %s", mustJSON(&e))
	}
	if st, _ := s.ThreadStatus("t-r"); st != "idle" {
		t.Errorf("status %q after a refused dispatch", st)
	}
	s.RefuseDispatch("")
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c3", "t-r", "m-2", "hello")))
}

// A Chunk out when its socket died is never acknowledged: the cumulative counters stay one
// apart for good (the load harness's "1 of N chunks unacknowledged" after a reconnect), while
// ShellStreams/ShellUnsettled tell that the new stream has everything applied.
func TestStreamsSettledAfterReconnect(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	s.AddThread(pid, "t", "idle")
	c := dial(t, s, s.Token(), nil)
	sh := c.subscribe("orchestration.subscribeShell", `{"requestCompletionMarker":true}`, false)
	for len(c.chunks[sh]) == 0 {
		c.pump()
	}
	if st := s.Stats(); st.ShellStreams != 1 || st.ShellUnsettled != 1 {
		t.Fatalf("chunk out, no Ack: stats %+v, want one shell stream, unsettled", st)
	}
	c.close() // the link dies with the Chunk unacknowledged
	for s.Stats().WSOpen != 0 {
		time.Sleep(time.Millisecond)
	}
	if st := s.Stats(); st.ShellStreams != 0 || st.ShellUnsettled != 0 {
		t.Fatalf("after the drop: stats %+v, want no stream", st)
	}

	c2 := dial(t, s, s.Token(), nil)
	sh2 := c2.subscribe("orchestration.subscribeShell", fmt.Sprintf(`{"afterSequence":%d,"requestCompletionMarker":true}`, s.Head()), true)
	c2.waitItem(sh2, 0, func(v map[string]any) bool { return v["kind"] == "synchronized" })
	c2.barrier()
	st := s.Stats()
	if st.ShellStreams != 1 || st.ShellUnsettled != 0 {
		t.Errorf("resubscribed and acknowledged: stats %+v, want one shell stream, settled", st)
	}
	if st.AcksReceived >= st.ChunksSent {
		t.Errorf("stats %+v: the lost Chunk should stay unacknowledged in the totals", st)
	}
}

// TestThreadSubscriptionSwitches: subscribeThread with acceptBoundedSnapshot sends T3's bounded
// answer (the window of timeline rows, every run, the history fields: as /bounded); without it
// the whole projection.
// FailThreadSubscriptions fails new subscriptions; StallThreadStreams holds thread chunks back
// while the shell stream goes on; Stats counts the open thread streams.
func TestThreadSubscriptionSwitches(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 2})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	for range 2 {
		if _, err := s.StartRun(tid, "run"); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
	}
	c := dial(t, s, s.Token(), nil)
	snapshot := func(payload string) map[string]any {
		id := c.subscribe("orchestration.subscribeThread", payload, true)
		c.waitItem(id, 0, func(m map[string]any) bool { return m["kind"] == "snapshot" })
		return asMap(t, c.items[id][0])
	}
	whole := snapshot(fmt.Sprintf(`{"threadId":%q}`, tid))
	bounded := snapshot(fmt.Sprintf(`{"threadId":%q,"acceptBoundedSnapshot":true}`, tid))
	items := func(m map[string]any) int { return len(path(m, "projection", "turnItems").([]any)) }
	runs := func(m map[string]any) int { return len(path(m, "projection", "runs").([]any)) }
	if items(bounded) != 2 || items(whole) <= 2 || runs(bounded) != 2 || runs(whole) != 2 {
		t.Fatalf("bounded snapshot: %d items, %d runs; whole: %d items, %d runs", items(bounded), runs(bounded), items(whole), runs(whole))
	}
	// The bounded snapshot is T3's bounded answer, as /bounded gives it at the same head.
	b := asMap(t, []byte(doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/"+tid+"/bounded", bearer(s.Token()), "").body))
	if delete(bounded, "kind"); !reflect.DeepEqual(bounded, b) || b["hasMoreHistory"] != true {
		t.Errorf("bounded snapshot %v\nis not /bounded's answer %v", bounded, b)
	}
	if n := s.Stats().ThreadStreams; n != 2 {
		t.Fatalf("ThreadStreams %d, want 2", n)
	}

	s.StallThreadStreams(true)
	shell := c.subscribe("orchestration.subscribeShell", `{"requestCompletionMarker":true}`, true)
	c.waitItem(shell, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })
	th := c.subscribe("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid), true)
	for s.Stats().ThreadStreams != 3 {
		c.barrier() // the server has read the subscription once it answered a later Ping
	}
	if _, err := s.StartRun(tid, "run"); err != nil {
		t.Fatal(err)
	}
	c.waitItem(shell, 0, func(m map[string]any) bool { return m["kind"] == "thread.updated" })
	c.barrier()
	if s.Stats().ThreadStreams != 3 || len(c.items[th]) != 0 {
		t.Fatalf("a stalled thread stream sent %d items", len(c.items[th]))
	}
	s.StallThreadStreams(false)
	c.waitItem(th, 0, func(m map[string]any) bool { return m["kind"] == "event" })

	s.FailThreadSubscriptions(true)
	before := s.Stats().ThreadStreams
	ex := c.call("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid))
	if raw := mustJSON(&ex); !strings.Contains(raw, "OrchestrationV2GetThreadProjectionError") || s.Stats().ThreadStreams != before {
		t.Fatalf("a failed subscription: %s", raw)
	}
}
