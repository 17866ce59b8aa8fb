// Package t3fake is a fake T3 Code server (`t3 serve`, orchestration protocol 2) that runs
// in-process on 127.0.0.1 and speaks T3's real wire protocol: the HTTP reads with bearer auth and
// T3's JSON error bodies, and Effect RPC JSON over /ws with Ack flow control. Its shapes come from
// the recordings in testdata/t3 and every body it sends is built with the generated wire types in
// gen/t3rpc and gen/t3api, so what it sends is exactly what the connector decodes.
//
// It has three users, which is why it looks the way it does:
//   - the connector's tests: fault switches (DropConnections, RefuseTickets, SetUnauthorized,
//     StopPongs, StallStreams, HTTPFail, HTTPHang, Restart, SetProtocol, RefuseDispatch,
//     BoundedRoute, ArchiveThread) and, with
//     Options.ManualSteps, runs that advance only when the test calls Step;
//   - benchmarks and the load harness: one mutex-guarded state machine, every stream item encoded
//     once and shared by all subscribers, a bounded replay log, AddThread for bulk seeding, Stats
//     and the OnItemSent hook for latency;
//   - the built-in demo machine: runs are scripted and deterministic, chosen by a word in the
//     prompt, with readable replies.
//
// # Scripted runs
//
// message.dispatch (and launchThread with an initial message) starts a run whose script is chosen
// by the first row of Scripts that has a word of the prompt starting with one of its words
// (case-insensitive; "Failing" picks fail). The steps are paced by Options.StepDelay or, with
// Options.ManualSteps, by Server.Step.
//
//	word               script    what happens
//	(none)             default   starting → running → command_execution (running, then exit 0) →
//	                             file_change README.md (+3 −1) → assistant reply
//	                             "Done: <first 60 chars of the prompt>" → waiting → checkpoint
//	                             (README.md modified, +3 −1) → completed
//	question           question  starting → running → a pending user_input runtime request with a
//	                             user_input_request turn item holding two questions ("scope":
//	                             single-select Workspace|Session; "checks": multiSelect lint|test)
//	                             and the shell's pendingRuntimeRequest set. It waits for
//	                             runtime-request.respond (answers are recorded, see Answers), then
//	                             replies "Done: <prompt>. Answers: checks=lint, test; scope=Workspace"
//	                             → waiting → checkpoint (no files) → completed
//	hang, forever      hang      starting → running → a command_execution that never finishes; only
//	                             run.interrupt ends it: run_interrupt_request, then
//	                             run_interrupt_result and the run interrupted
//	fail               fail      starting → running → an error turn item {failure: {class:
//	                             "provider_error", message: "Simulated provider failure: <prompt>"}}
//	                             → failed
//	approv…, permission approval starting → running → command_execution `cat server/package.json`
//	                             and a pending approval of kind command (fixture 18: an
//	                             approval_request item with requestKind and the command as prompt, no
//	                             options). A decision resolves it: accept/acceptForSession/decline →
//	                             the run goes on and completes; cancel → the run ends cancelled.
//	                             Answers instead of a decision resolve it too, and the run then hangs
//	                             until run.interrupt, as T3's does
//	elicit             elicitation a form elicitation as a user_input question (fixture 19: id
//	                             "approved", "Approve this request?", options true|false) → completed
//	stale              stale     a user_input request whose responseCapability is not_resumable;
//	                             answering it fails (not recorded: T3 may accept and deliver nothing);
//	                             only run.interrupt ends the run
//
// A message.dispatch on a busy thread queues the run (fixture 21): run.created with status queued,
// the row's latestRunId on it while activeRunId stays on the running run, and the row's status
// following the newest run (queued; cancelled after queued-run.cancel of the newest). The queued
// runs start by themselves, in order, once the active run ends.
//
// Any run in preparing, starting, running or waiting (including a question waiting for its
// answer, whose request is then cancelled) can be interrupted. Runs are numbered like T3's:
// run:thread:<threadId>:ordinal:<n>, and run.userMessageId is the dispatched messageId.
//
// # How closely it follows T3
//
// Followed exactly: descriptor (protocol 2 or 1), session, tickets (single-use, 5-minute expiry),
// the 400/401/403/404/426 bodies, Request/Ack/Interrupt/Ping/Eof in, Chunk/Exit/Pong/Defect out,
// arrays of messages in either direction (Options.BatchFrames makes the fake send arrays), one
// Chunk in flight per stream until its Ack, one global event sequence, the subscription order
// (snapshot or replay, then synchronized, then live), dispatch results {sequence}, commandId
// receipts, and the failure texts of the recordings. HTTP answers carry Vary: Accept-Encoding and
// come gzipped when the request accepts gzip and the body is at least 1 KiB, plain otherwise
// (gzip.go: what the recordings show of T3's answers; the exact threshold is not recorded).
//
// Deliberate differences, all in fields the connector does not read (the shape test in this
// package pins them): records carry only the fields the generated types declare, so T3's nodeId,
// providerThreadId, nativeItemRef, lineage, attempts[], nodes[], the typed errors' cause chain,
// the session's auth block and similar internals are absent (see omittedKeys in
// shapes_test.go). Further:
//   - interrupting a subscribeThread stream answers Exit Failure Interrupt (the recorded build
//     answered a Die about its error schema there, which looks like a bug);
//   - a stream's snapshot item always travels alone in its Chunk; other items are batched while a
//     Chunk waits for its Ack, as T3 does;
//   - the replay window is one number for shell and thread streams: a gap (head − afterSequence)
//     larger than Options.ReplayLimit gives a snapshot instead of a replay;
//   - only thread.create, message.dispatch (start_immediately and queue_after_active, which both
//     queue on a busy thread), run.interrupt, runtime-request.respond, thread.model-selection.set,
//     queued-run.cancel and thread.archive are implemented; the other T3 command types fail with
//     OrchestrationV2DispatchCommandError, unknown ones with T3's Die;
//   - getThreadProjection and /threads/{id} return the whole projection; /bounded is built as
//     T3 builds it (bounded.go): a window of the newest ten user turns, at most 75 items
//     (Options.HistoryPage when set) within a 1 MiB budget, in turnItems and visibleTurnItems,
//     messages only those the window or the latest and active runs need, runs, requests and
//     checkpoints whole, with a history cursor for the older items; a subscribeThread snapshot
//     with acceptBoundedSnapshot is the same answer;
//   - memory stays bounded under load: a thread keeps its newest Options.KeepRuns runs (older
//     finished runs leave its projection) and the newest 100,000 commandIds are remembered;
//   - POST /api/projects/mutate knows project.create only;
//   - Eof is accepted and ignored; server.probe answers {}; tokens never expire.
//
// # Using it
//
//	s, err := t3fake.New(t3fake.Options{Label: "demo", StepDelay: t3fake.DefaultStepDelay})
//	pid := s.AddProject("api", "/srv/api")
//	tid := s.AddThread(pid, "Fix CI", "idle")
//	// point the connector at s.URL() with s.Token(); or drive runs directly:
//	runID, err := s.StartRun(tid, "Please fix the failing test")
//	defer s.Close()
//
// Tests use StartT (closes with the test) and Options.ManualSteps with Step/StepAll.
package t3fake
