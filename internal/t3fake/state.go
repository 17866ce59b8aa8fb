package t3fake

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// The model. Every record is kept as the generated wire type it is sent as, so a projection or a
// shell row is assembled by copying, never translated. Everything here runs under Server.mu.

type project struct {
	rec  t3rpc.Project // DeletedAt unset: the shell form; /api/projects adds deletedAt:null
	refs []string      // git refs of the workspace (SetGitRefs); none: not a git repository
}

type thread struct {
	// mu guards what a thread read answers (app, runs and their records, requests, messages,
	// items, checkpoints, updatedAt) against the HTTP thread reads, which take only it, not
	// Server.mu: a read of one thread does not wait behind the driver's steps of the others
	// (under load they held Server.mu nearly all the time). Whoever changes those fields holds
	// Server.mu and mu (mustHold checks it where every change passes).
	mu          sync.Mutex
	id          string
	app         t3rpc.AppThread
	shell       t3rpc.ThreadShell
	runs        []*run
	requests    []t3rpc.RuntimeRequest
	messages    []t3rpc.Message
	items       []*t3rpc.TurnItem // replaced by upsertItem, never changed in place (events share them)
	checkpoints []t3rpc.Checkpoint
	updatedAt   string
	active      *run   // the run that keeps the thread busy (until completed/interrupted/failed)
	queued      []*run // runs dispatched while another was active, in order (fixture 21)
	runCount    int64
	archived    bool      // thread.archive: its row moves to the archive list
	rows        *rowCache // the encoded parts of its rows, while a run is active (rows.go)
}

// mustHold panics unless th.mu is held (by anyone: sync.Mutex cannot say by whom). Every
// change of a thread's readable state passes through touch or emit, which call it.
func (th *thread) mustHold() {
	if th.mu.TryLock() {
		th.mu.Unlock()
		panic("t3fake: thread " + th.id + " changed without its lock (thread.mu)")
	}
}

// newest is the thread's latest run (nil before the first).
func (th *thread) newest() *run {
	if len(th.runs) == 0 {
		return nil
	}
	return th.runs[len(th.runs)-1]
}

// rowStatus sets the row's status for run r. The row's status follows the
// newest run, not the thread (recorded, fixture 21): an older run's progress
// leaves it alone while a newer run waits in the queue.
func (th *thread) rowStatus(r *run, status string) {
	if th.newest() == r {
		th.shell.Status = status
	}
}

// logEntry is one sequence of the global event log. A thread event and the shell row it produced
// share a sequence, as in T3 (the shell item carries the sequence of its last event); project
// items have a sequence of their own.
type logEntry struct {
	seq      int64
	threadID string
	// The thread event, if the entry has one. It is encoded into a ThreadStreamItem only when a
	// thread subscriber needs it (threadItem): under load nobody subscribes to most threads, and
	// building every event's envelope was much of the fake's cost per step.
	// The payload is kept as a copy of the record and encoded with the envelope: encoding twelve
	// payloads per run that nobody reads was a tenth of the fake's cost per run.
	evType    string // "" when the entry has no thread event
	evRunID   string
	evAt      time.Time
	evPayload encoder // a copy of the record, not changed after emit
	thread    jx.Raw  // the encoded ThreadStreamItem, once made
	shell     jx.Raw  // encoded ShellStreamItem, or nil
	shellKind string
}

// threadItem returns the entry's encoded ThreadStreamItem (kind event), encoding it on first use.
// Callers hold Server.mu.
func (e *logEntry) threadItem() jx.Raw {
	if e.thread == nil && e.evType != "" {
		ev := t3rpc.DomainEvent{
			ID:         "event:thread:" + e.threadID + ":sequence:" + strconv.FormatInt(e.seq, 10),
			ThreadId:   e.threadID,
			OccurredAt: iso(e.evAt),
			Type:       e.evType,
			Payload:    encode(e.evPayload),
		}
		if e.evRunID != "" {
			ev.RunId = optStr(e.evRunID)
		}
		item := t3rpc.ThreadStreamItem{Kind: "event", Sequence: optI64(e.seq), Event: t3rpc.NewOptDomainEvent(ev)}
		e.thread = encode(&item)
		e.evPayload = nil // encoded now; the copy is garbage
	}
	return e.thread
}

func (e *logEntry) threadKind() string { return "thread:" + e.evType }

// maxReceipts is how many commandIds the fake remembers. T3 keeps receipts forever; a bound keeps
// a long load run's memory flat, and a retry comes long before 100,000 newer commands.
const maxReceipts = 100_000

// remember stores a command receipt, forgetting the oldest ones past maxReceipts.
func (s *Server) remember(id string, rc receipt) {
	if _, seen := s.receipts[id]; !seen {
		s.receiptIDs = append(s.receiptIDs, id)
	}
	s.receipts[id] = rc
	if len(s.receiptIDs) > maxReceipts+maxReceipts/10 {
		drop := len(s.receiptIDs) - maxReceipts
		for _, old := range s.receiptIDs[:drop] {
			delete(s.receipts, old)
		}
		n := copy(s.receiptIDs, s.receiptIDs[drop:])
		clear(s.receiptIDs[n:])
		s.receiptIDs = s.receiptIDs[:n]
	}
}

// pruneRuns drops the records of th's oldest finished runs beyond keepRuns (see Options.KeepRuns).
func (s *Server) pruneRuns(th *thread) {
	if s.keepRuns < 0 || len(th.runs) <= s.keepRuns {
		return
	}
	gone, goneReqs := map[string]bool{}, map[string]bool{}
	keep := th.runs[:0]
	excess := len(th.runs) - s.keepRuns
	for _, r := range th.runs {
		if excess > 0 && r.state == runDone {
			excess--
			gone[r.rec.ID] = true
			for _, id := range r.requests {
				delete(s.answers, id)
				goneReqs[id] = true
			}
			continue
		}
		keep = append(keep, r)
	}
	clear(th.runs[len(keep):])
	th.runs = keep
	if len(gone) == 0 {
		return
	}
	ofGone := func(runID t3rpc.OptNilString) bool { return gone[runID.Value] }
	th.items = slices.DeleteFunc(th.items, func(it *t3rpc.TurnItem) bool { return ofGone(it.RunId) })
	th.messages = slices.DeleteFunc(th.messages, func(m t3rpc.Message) bool { return ofGone(m.RunId) })
	th.checkpoints = slices.DeleteFunc(th.checkpoints, func(c t3rpc.Checkpoint) bool { return ofGone(c.RunId) })
	th.requests = slices.DeleteFunc(th.requests, func(rr t3rpc.RuntimeRequest) bool { return goneReqs[rr.ID] })
}

type receipt struct {
	threadID string
	seq      int64
	fail     *t3rpc.TaggedError // a rejected command: replays fail with "previously rejected"
	launch   bool
}

// codexSelection is the usable provider of server.getConfig, for seeded threads and projects.
var codexSelection = t3rpc.ModelSelection{InstanceId: ProviderInstance, Model: ProviderModel}

// ts is now as T3 writes it. Steps come thousands per second under load and a timestamp has
// millisecond resolution, so the last one formatted is reused within its millisecond.
func (s *Server) ts() string {
	now := s.now()
	if ms := now.UnixMilli(); ms != s.tsMilli || s.tsText == "" {
		s.tsMilli, s.tsText = ms, iso(now)
	}
	return s.tsText
}

// appendLog adds an entry and trims the log so it holds at least the last replayLimit sequences.
// Trimming copies down in bulk once the log is twice that long, so appends stay O(1) amortized
// and the backing array does not grow without bound under load.
func (s *Server) appendLog(e logEntry) {
	s.log = append(s.log, e)
	keep := s.replayLimit
	if keep < 0 {
		keep = 0
	}
	if len(s.log) > 2*keep+64 {
		cut := len(s.log) - keep
		s.logBase = s.log[cut-1].seq
		n := copy(s.log, s.log[cut:])
		clear(s.log[n:])
		s.log = s.log[:n]
	}
}

// canReplay reports whether every item after afterSequence is still in the log and the gap is
// within the replay limit. Otherwise the subscriber gets a snapshot: its cursor is ahead of the
// head (a replaced database), behind the log, or too far behind.
func (s *Server) canReplay(after int64) bool {
	if s.replayLimit < 0 || after > s.head || after < s.logBase {
		return false
	}
	return s.head-after <= int64(s.replayLimit)
}

// logFrom is the index of the first entry with seq > after.
func (s *Server) logFrom(after int64) int {
	return sort.Search(len(s.log), func(i int) bool { return s.log[i].seq > after })
}

// copyOf is a copy of a record for emit, which keeps it as the event's payload: the caller's
// record goes on changing, the event must not.
func copyOf[T any](v T) *T { return &v }

// emit appends one domain event of th to the log and queues it on th's subscriptions. payload
// is a record the caller does not change afterwards (copyOf); it is encoded only when a thread
// subscriber or a replay needs the event.
func (s *Server) emit(th *thread, runID, typ string, payload encoder) {
	th.mustHold()
	s.head++
	s.headPub.Store(s.head)
	s.appendLog(logEntry{seq: s.head, threadID: th.id, evType: typ, evRunID: runID, evAt: s.now(), evPayload: payload})
	subs := s.threadSubs[th.id]
	if len(subs) == 0 {
		return
	}
	e := &s.log[len(s.log)-1]
	raw, kind := e.threadItem(), e.threadKind()
	for sb := range subs {
		sb.push(queued{raw: raw, kind: kind, seq: e.seq})
	}
}

// publishShell sends th's shell row as thread.updated at the current head: the row changed because
// of the event just emitted, so it shares that event's sequence.
func (s *Server) publishShell(th *thread) {
	th.shell.UpdatedAt = optStr(th.updatedAt)
	th.shell.ItemCount = optI64(int64(len(th.items)))
	location := "active"
	if th.archived {
		location = "archive" // recorded (23): archived rows keep coming, marked so
	}
	// Encoded from th.shell in place: a ShellStreamItem holding a copy of the row is a kilobyte,
	// and one per step on the heap was a tenth of the fake's cost per run. The parts of the row
	// that repeat come from its row cache (rows.go).
	rc := s.rowsOf(th)
	s.shellItemRaw(th.id, true, func(buf []byte, seq int64) []byte {
		return rc.appendRow(buf, seq, location, &th.shell)
	}, "thread.updated")
	s.releaseRows(th)
}

// shellItem logs and fans out one shell item. With sameSeq it rides on the newest log entry (the
// event that caused it); otherwise it takes a new sequence.
func (s *Server) shellItem(item t3rpc.ShellStreamItem, threadID string, sameSeq bool) {
	s.shellItemFunc(threadID, sameSeq, func(e *jx.Encoder, seq int64) {
		item.Sequence = optI64(seq)
		item.Encode(e)
	}, item.Kind)
}

// shellItemFunc is shellItem with the item written by enc at sequence seq.
func (s *Server) shellItemFunc(threadID string, sameSeq bool, enc func(e *jx.Encoder, seq int64), itemKind string) {
	s.shellItemRaw(threadID, sameSeq, func(buf []byte, seq int64) []byte {
		e := &s.slab.enc
		e.Reset()
		e.SetBytes(buf)
		enc(e, seq)
		out := e.Bytes()
		e.SetBytes(nil)
		return out
	}, itemKind)
}

// shellItemRaw is shellItem with the item appended by app to the slice it is given, at sequence seq.
func (s *Server) shellItemRaw(threadID string, sameSeq bool, app func(buf []byte, seq int64) []byte, itemKind string) {
	if !sameSeq || len(s.log) == 0 || s.log[len(s.log)-1].seq != s.head {
		s.head++
		s.headPub.Store(s.head)
		s.appendLog(logEntry{seq: s.head, threadID: threadID})
	}
	seq := s.head
	raw := s.slab.append(seq, func(buf []byte) []byte { return app(buf, seq) })
	kind := shellKind(itemKind)
	last := &s.log[len(s.log)-1]
	last.shell, last.shellKind = raw, kind
	for sb := range s.shellSubs {
		sb.push(queued{raw: raw, kind: kind, seq: s.head})
	}
}

// slabReusable reports whether no reader can still hold a shell item with a sequence up to
// last: the log has dropped them (they are at or below logBase) and no shell subscriber has one
// queued. A subscriber's items are copied out of its queue into a frame under c.mu (collect),
// so once an item has left the queue nothing reads its bytes. Callers hold Server.mu.
func (s *Server) slabReusable(last int64) bool {
	if last > s.logBase {
		return false
	}
	for sb := range s.shellSubs {
		if first := sb.firstSlabSeq(); first != 0 && first <= last {
			return false
		}
	}
	return true
}

// shellKind is the OnItemSent kind of a shell item; the common ones without an allocation.
func shellKind(k string) string {
	switch k {
	case "thread.updated":
		return "shell:thread.updated"
	case "project.updated":
		return "shell:project.updated"
	}
	return "shell:" + k
}

// touch marks th changed now.
func (s *Server) touch(th *thread) string {
	th.mustHold()
	ts := s.ts()
	th.updatedAt = ts
	th.app.UpdatedAt = optStr(ts)
	return ts
}

// ---- snapshots ----

func (s *Server) shellSnapshot() t3rpc.ShellSnapshot {
	snap := t3rpc.ShellSnapshot{
		SchemaVersion:    t3rpc.NewOptInt(2),
		SnapshotSequence: s.head,
		Threads:          make([]t3rpc.ThreadShell, 0, len(s.threads)),
		ArchivedThreads:  []t3rpc.ThreadShell{},
		Projects:         make([]t3rpc.Project, len(s.projects)),
	}
	for _, th := range s.threads {
		if th.archived {
			snap.ArchivedThreads = append(snap.ArchivedThreads, th.shell)
		} else {
			snap.Threads = append(snap.Threads, th.shell)
		}
	}
	for i, p := range s.projects {
		snap.Projects[i] = p.rec
	}
	return snap
}

// projection copies th's projection (the whole thread).
func (s *Server) projection(th *thread) t3rpc.ThreadProjection {
	p := t3rpc.ThreadProjection{
		Thread:          th.app,
		Runs:            make([]t3rpc.Run, len(th.runs)),
		RuntimeRequests: append([]t3rpc.RuntimeRequest{}, th.requests...),
		Messages:        append([]t3rpc.Message{}, th.messages...),
		TurnItems:       itemValues(th.items),
		Checkpoints:     append([]t3rpc.Checkpoint{}, th.checkpoints...),
		UpdatedAt:       optStr(th.updatedAt),
	}
	for i, r := range th.runs {
		p.Runs[i] = r.rec
	}
	return p
}

// encodeProjection writes th's whole projection (GET /threads/{id}) as projection(th).Encode
// would, byte for byte (TestEncodeProjectionIsTheCopysEncoding), straight from the thread's
// records: a thread read of a long thread copied every run, message and checkpoint record before
// encoding them, a third of the fake's CPU per read at 5,000 turn items (BenchmarkBoundedGET).
// The bounded read is encodeBounded's. The caller holds th.mu until it is done.
func encodeProjection(e *jx.Encoder, th *thread, controlPlane bool) {
	e.ObjStart()
	encodeProjectionHead(e, th, controlPlane)
	encodeRecords(e, "messages", th.messages)
	e.FieldStart("turnItems")
	e.ArrStart()
	for _, it := range th.items {
		it.Encode(e)
	}
	e.ArrEnd()
	encodeRecords(e, "checkpoints", th.checkpoints)
	e.FieldStart("updatedAt")
	e.Str(th.updatedAt)
	e.ObjEnd()
}

// encodeProjectionHead writes the projection's first fields, which the whole read and /bounded
// send alike: the thread, its runs, with controlPlane their attempts and nodes, the runtime
// requests.
func encodeProjectionHead(e *jx.Encoder, th *thread, controlPlane bool) {
	e.FieldStart("thread")
	th.app.Encode(e)
	e.FieldStart("runs")
	e.ArrStart()
	for _, r := range th.runs {
		r.rec.Encode(e)
	}
	e.ArrEnd()
	if controlPlane {
		encodeControlPlane(e, th)
	}
	encodeRecords(e, "runtimeRequests", th.requests)
}

// encodeRecords writes the field name with xs as an array, each record by its generated encoder.
func encodeRecords[T any, P interface {
	*T
	Encode(*jx.Encoder)
}](e *jx.Encoder, name string, xs []T) {
	e.FieldStart(name)
	e.ArrStart()
	for i := range xs {
		P(&xs[i]).Encode(e)
	}
	e.ArrEnd()
}

// encodeControlPlane writes Options.ControlPlane's parts: an attempt and a node per run, in T3's
// projection order (after runs), their fields as the recorded build's (fixture 11).
func encodeControlPlane(e *jx.Encoder, th *thread) {
	e.FieldStart("attempts")
	e.ArrStart()
	for _, r := range th.runs {
		esc := r.escapedID()
		e.ObjStart()
		e.FieldStart("id")
		e.Str("run-attempt:run:" + esc + ":attempt:1")
		e.FieldStart("runId")
		e.Str(r.rec.ID)
		e.FieldStart("attemptOrdinal")
		e.Int(1)
		e.FieldStart("rootNodeId")
		e.Str("node:run:" + esc + ":root")
		e.FieldStart("providerInstanceId")
		e.Str("codex")
		e.FieldStart("providerThreadId")
		e.Str("provider-thread:provider:codex:native-thread:pending%3A" + esc)
		e.FieldStart("providerTurnId")
		e.Null()
		e.FieldStart("reason")
		e.Str("initial")
		e.FieldStart("status")
		e.Str(r.rec.Status)
		e.FieldStart("startedAt")
		r.rec.StartedAt.Encode(e)
		e.FieldStart("completedAt")
		r.rec.CompletedAt.Encode(e)
		e.ObjEnd()
	}
	e.ArrEnd()
	e.FieldStart("nodes")
	e.ArrStart()
	for _, r := range th.runs {
		esc := r.escapedID()
		e.ObjStart()
		e.FieldStart("id")
		e.Str("node:run:" + esc + ":root")
		e.FieldStart("threadId")
		e.Str(th.id)
		e.FieldStart("runId")
		e.Str(r.rec.ID)
		e.FieldStart("parentNodeId")
		e.Null()
		e.FieldStart("rootNodeId")
		e.Str("node:run:" + esc + ":root")
		e.FieldStart("kind")
		e.Str("root_turn")
		e.FieldStart("status")
		e.Str(r.rec.Status)
		e.FieldStart("countsForRun")
		e.Bool(true)
		e.FieldStart("providerThreadId")
		e.Str("provider-thread:provider:codex:native-thread:pending%3A" + esc)
		e.FieldStart("providerTurnId")
		e.Null()
		e.FieldStart("nativeItemRef")
		e.Null()
		e.FieldStart("runtimeRequestId")
		e.Null()
		e.FieldStart("checkpointScopeId")
		e.Str("checkpoint-scope:thread:" + th.id + ":name:root")
		e.FieldStart("startedAt")
		r.rec.StartedAt.Encode(e)
		e.FieldStart("completedAt")
		r.rec.CompletedAt.Encode(e)
		e.ObjEnd()
	}
	e.ArrEnd()
}

// ---- record upserts: T3 payloads are whole records, replaced by id ----

// itemValues copies items into the wire slice.
func itemValues(items []*t3rpc.TurnItem) []t3rpc.TurnItem {
	out := make([]t3rpc.TurnItem, len(items))
	for i, it := range items {
		out[i] = *it
	}
	return out
}

// addItem appends an item that is new (newItem made its id): no search of the thread's items.
func (th *thread) addItem(it *t3rpc.TurnItem) { th.items = append(th.items, it) }

// upsertItem stores it, replacing the item with its id. The thread keeps it: the caller does
// not change it afterwards.
func (th *thread) upsertItem(it *t3rpc.TurnItem) {
	for i := len(th.items) - 1; i >= 0; i-- {
		if th.items[i].ID == it.ID {
			th.items[i] = it
			return
		}
	}
	th.items = append(th.items, it)
}

// item returns a copy of the item with id.
func (th *thread) item(id string) (t3rpc.TurnItem, bool) {
	for i := len(th.items) - 1; i >= 0; i-- {
		if th.items[i].ID == id {
			return *th.items[i], true
		}
	}
	return t3rpc.TurnItem{}, false
}

func (th *thread) upsertMessage(m t3rpc.Message) {
	for i := len(th.messages) - 1; i >= 0; i-- {
		if th.messages[i].ID == m.ID {
			th.messages[i] = m
			return
		}
	}
	th.messages = append(th.messages, m)
}

func (th *thread) upsertRequest(rr t3rpc.RuntimeRequest) {
	for i := range th.requests {
		if th.requests[i].ID == rr.ID {
			th.requests[i] = rr
			return
		}
	}
	th.requests = append(th.requests, rr)
}

func (th *thread) request(id string) (t3rpc.RuntimeRequest, bool) {
	for _, rr := range th.requests {
		if rr.ID == id {
			return rr, true
		}
	}
	return t3rpc.RuntimeRequest{}, false
}

func (th *thread) run(id string) *run {
	for i := len(th.runs) - 1; i >= 0; i-- {
		if th.runs[i].rec.ID == id {
			return th.runs[i]
		}
	}
	return nil
}

// ---- creation ----

// addProject adds a project with id, or project-<n> when id is "".
func (s *Server) addProject(id, title, root string) *project {
	for id == "" || s.projectByID[id] != nil { // only a generated id can collide here
		s.nextProject++
		id = fmt.Sprintf("project-%d", s.nextProject)
	}
	ts := s.ts()
	p := &project{refs: []string{"main"}, rec: t3rpc.Project{
		ID:                    id,
		Title:                 title,
		WorkspaceRoot:         root,
		DefaultModelSelection: t3rpc.NewOptNilModelSelection(codexSelection),
		CreatedAt:             optStr(ts),
		UpdatedAt:             optStr(ts),
	}}
	s.projects = append(s.projects, p)
	s.projectByID[p.rec.ID] = p
	s.shellItem(t3rpc.ShellStreamItem{Kind: "project.updated", Project: t3rpc.NewOptProject(p.rec)}, "", false)
	return p
}

type threadSpec struct {
	id, projectID, title         string
	model                        t3rpc.ModelSelection
	runtimeMode, interactionMode string
	createdBy, creationSource    string
}

// createThread adds a thread and emits thread.created plus its idle shell row. It returns with
// th.mu unlocked: a caller that changes the thread further locks it.
func (s *Server) createThread(sp threadSpec) *thread {
	ts := s.ts()
	th := &thread{id: sp.id, updatedAt: ts}
	th.mu.Lock()
	defer th.mu.Unlock()
	th.app = t3rpc.AppThread{
		ID:              sp.id,
		ProjectId:       sp.projectID,
		Title:           sp.title,
		ModelSelection:  t3rpc.NewOptModelSelection(sp.model),
		RuntimeMode:     optStr(sp.runtimeMode),
		InteractionMode: optStr(sp.interactionMode),
		CreatedBy:       optStr(sp.createdBy),
		CreationSource:  optStr(sp.creationSource),
		Branch:          null(),
		WorktreePath:    null(),
		CreatedAt:       optStr(ts),
		UpdatedAt:       optStr(ts),
		ArchivedAt:      null(),
		DeletedAt:       null(),
	}
	th.shell = t3rpc.ThreadShell{
		ID:                    sp.id,
		ProjectId:             sp.projectID,
		Title:                 sp.title,
		ModelSelection:        t3rpc.NewOptModelSelection(sp.model),
		RuntimeMode:           optStr(sp.runtimeMode),
		InteractionMode:       optStr(sp.interactionMode),
		Status:                "idle",
		LatestRunId:           null(),
		ActiveRunId:           null(),
		LatestRunRequestedAt:  null(),
		LatestRunStartedAt:    null(),
		LatestRunCompletedAt:  null(),
		LastError:             jx.Raw("null"),
		PendingRuntimeRequest: t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true},
		LatestVisibleMessage:  t3rpc.OptNilVisibleMessage{Set: true, Null: true},
		Branch:                null(),
		WorktreePath:          null(),
		CreatedAt:             optStr(ts),
		ArchivedAt:            null(),
		DeletedAt:             null(),
	}
	s.threads = append(s.threads, th)
	s.idMu.Lock()
	s.threadByID[th.id] = th
	s.idMu.Unlock()
	s.emit(th, "", "thread.created", copyOf(th.app))
	s.publishShell(th)
	return th
}

// ---- seeding API ----

// AddProject adds a project (as T3's project.create would) and returns its id, project-<n>.
func (s *Server) AddProject(title, workspaceRoot string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addProject("", title, workspaceRoot).rec.ID
}

// seedStatuses are the statuses AddThread accepts.
var seedStatuses = map[string]bool{
	"idle": true, "preparing": true, "queued": true, "starting": true, "running": true, "waiting": true,
	"completed": true, "interrupted": true, "failed": true, "cancelled": true,
}

// AddThread adds a thread in projectID with the given shell status and returns its id,
// thread-<n>. Any status but idle gets one run in that status (no turn items), so the shell and
// the projection agree; an active one (preparing … waiting) keeps the thread busy until
// run.interrupt. It is meant for seeding thousands of threads: it panics on an unknown project or
// status, which are programming errors.
func (s *Server) AddThread(projectID, title, status string) string {
	if !seedStatuses[status] {
		panic(fmt.Sprintf("t3fake: AddThread: unknown status %q", status))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.projectByID[projectID] == nil {
		panic(fmt.Sprintf("t3fake: AddThread: no project %q", projectID))
	}
	s.nextThread++
	id := fmt.Sprintf("thread-%d", s.nextThread)
	for s.threadByID[id] != nil { // a client chose this id already
		s.nextThread++
		id = fmt.Sprintf("thread-%d", s.nextThread)
	}
	th := s.createThread(threadSpec{
		id: id, projectID: projectID, title: title, model: codexSelection,
		runtimeMode: "full-access", interactionMode: "default", createdBy: "user", creationSource: "server",
	})
	if status != "idle" {
		th.mu.Lock()
		s.seedRun(th, status)
		th.mu.Unlock()
	}
	return id
}

// AddThreadWithID adds an idle thread with a caller-chosen id (unique across machines, as T3's
// uuids are), as thread.create would, without a socket round trip: the load harness seeds
// 100,000 threads this way in seconds. It fails on an unknown project or a taken id.
func (s *Server) AddThreadWithID(projectID, id, title string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.projectByID[projectID] == nil {
		return fmt.Errorf("t3fake: no project %q", projectID)
	}
	if id == "" || s.threadByID[id] != nil {
		return fmt.Errorf("t3fake: thread id %q is empty or taken", id)
	}
	s.createThread(threadSpec{
		id: id, projectID: projectID, title: title, model: codexSelection,
		runtimeMode: "full-access", interactionMode: "default", createdBy: "user", creationSource: "server",
	})
	return nil
}

// RemoveThread deletes a thread: subscribers of the shell see thread.removed. Thread
// subscriptions of it stay open and silent, as in T3.
func (s *Server) RemoveThread(threadID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	th := s.threadByID[threadID]
	if th == nil {
		return false
	}
	s.idMu.Lock()
	delete(s.threadByID, threadID)
	s.idMu.Unlock()
	for i, t := range s.threads {
		if t == th {
			s.threads = append(s.threads[:i], s.threads[i+1:]...)
			break
		}
	}
	s.readyQ = dropThreadRuns(s.readyQ, th)
	s.shellItem(t3rpc.ShellStreamItem{Kind: "thread.removed", Location: optStr("active"), ThreadId: optStr(threadID)}, threadID, false)
	return true
}

func dropThreadRuns(q []*run, th *thread) []*run {
	out := q[:0]
	for _, r := range q {
		if r.th != th {
			out = append(out, r)
		}
	}
	clear(q[len(out):])
	return out
}

// StartRun dispatches prompt on threadID as a client's message.dispatch would (with a
// server-made messageId) and returns the run id. It lets the load harness and the demo start
// runs without a WebSocket.
func (s *Server) StartRun(threadID, prompt string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	th := s.threadByID[threadID]
	if th == nil {
		return "", fmt.Errorf("t3fake: no thread %q", threadID)
	}
	if th.active != nil {
		return "", fmt.Errorf("t3fake: thread %s has an active run %s", threadID, th.active.rec.ID)
	}
	s.nextMessage++
	th.mu.Lock()
	defer th.mu.Unlock()
	r := s.startRun(th, fmt.Sprintf("message-server-%d", s.nextMessage), prompt, t3rpc.OptModelSelection{}, false, true)
	return r.rec.ID, nil
}
