package app_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// Thread reads by route, as the fake counts them.
const (
	routeFull    = "GET /api/orchestration/threads/{id}"
	routeBounded = "GET /api/orchestration/threads/{id}/bounded"
	routeHistory = "GET /api/orchestration/threads/{id}/history"
)

type threadReads struct{ full, bounded, history int64 }

func readsOf(s *t3fake.Server) threadReads {
	st := s.Stats().HTTPRequests
	return threadReads{st[routeFull], st[routeBounded], st[routeHistory]}
}

func (a threadReads) minus(b threadReads) threadReads {
	return threadReads{a.full - b.full, a.bounded - b.bounded, a.history - b.history}
}

// manualHarness is a connector on one fake machine whose runs move only when
// the test steps them.
func manualHarness(t *testing.T) *harness {
	t.Helper()
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	return h
}

// waitAsync runs t3_wait in the background.
func waitAsync(c *client, args map[string]any) chan map[string]any {
	out := make(chan map[string]any, 1)
	go func() {
		sc, text, isErr := c.call("t3_wait", args)
		if isErr {
			sc = map[string]any{"error": text}
		}
		out <- sc
	}()
	return out
}

// TestDispatchAndWaitReadCounts: a dispatch and a wait for its run do not read
// the thread at all (issue 12.3; a dispatch+wait used to make three full
// reads, then one bounded read at completion). The dispatch learns the run
// from the shell row, so the wait judges the row alone; once it blocks, the
// thread's own subscription keeps its projection current, and the result is
// rendered from it. A wait that ends at once reads the thread once, bounded.
func TestDispatchAndWaitReadCounts(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("reads")
	before := readsOf(h.fake)
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	tid := str(d, "thread_id")
	if str(d, "run_id") == "" {
		t.Fatalf("the dispatch did not learn its run from the row: %v", d)
	}
	done := waitAsync(c, map[string]any{"thread_id": tid, "timeout": 60})
	eventually(t, 10*time.Second, "the wait to block", func() bool { return h.app.Deps.ActiveWaits() == 1 }, nil)
	if got := readsOf(h.fake).minus(before); got != (threadReads{}) {
		t.Fatalf("reads before the run moved: %+v, want none", got)
	}
	h.fake.StepAll()
	res := <-done
	if str(res, "reason") != "completed" || str(res, "state", "latest_run", "id") != str(d, "run_id") {
		t.Fatalf("wait result %v", res)
	}
	if str(res, "state", "status") != "completed" || !strings.Contains(dump(res, "state", "runs"), "Done: "+promptDone) {
		t.Fatalf("state %v", res["state"])
	}
	if got := readsOf(h.fake).minus(before); got != (threadReads{}) {
		t.Fatalf("dispatch + wait read %+v, want none: the result comes from the thread's subscription", got)
	}
	// The result's stages are in /metrics: the subscription caught up, the render, the whole
	// result; no read.
	for stage, want := range map[string]string{"feed": "1", "render": "1", "answered": "1", "read": ""} {
		if got := h.metric(`t3code_mcp_wait_result_seconds_count{stage="` + stage + `"}`); got != want {
			t.Errorf("t3code_mcp_wait_result_seconds_count{stage=%q} = %q after one wait, want %q", stage, got, want)
		}
	}
	feedsClosed(t, h)

	// A wait on the settled run returns at once with one bounded read too.
	rowCaughtUp(t, h, tid, res)
	before = readsOf(h.fake)
	if r := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 5}); str(r, "reason") != "completed" {
		t.Fatalf("second wait %v", r)
	}
	if got := readsOf(h.fake).minus(before); got != (threadReads{bounded: 1}) {
		t.Fatalf("a wait on a settled run read %+v", got)
	}
}

// TestFollowUpOnABusyThreadIsQueuedAndWaitedFor: T3 queues a prompt sent to a
// busy thread (fixture 21). The wait targets the queued run, holds through the
// first run's end, and ends with the follow-up's outcome, reading only once.
func TestFollowUpOnABusyThreadIsQueuedAndWaitedFor(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("queue")
	d1 := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptHang})
	tid := str(d1, "thread_id")
	h.fake.StepAll() // run 1 hangs
	d2 := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": promptDone})
	run1, run2 := str(d1, "run_id"), str(d2, "run_id")
	if run2 == "" || run2 == run1 {
		t.Fatalf("the follow-up's run %q (first run %q)", run2, run1)
	}
	done := waitAsync(c, map[string]any{"thread_id": tid, "timeout": 60})
	eventually(t, 10*time.Second, "the wait to block", func() bool { return h.app.Deps.ActiveWaits() == 1 }, nil)
	c.ok("t3_interrupt", map[string]any{"thread_id": tid})
	// The interrupt's own state read is not the wait's.
	before := readsOf(h.fake)
	h.fake.StepAll() // run 1 interrupted; run 2 starts and completes
	res := <-done
	if str(res, "reason") != "completed" || str(res, "state", "latest_run", "id") != run2 {
		t.Fatalf("wait result %v", res)
	}
	if got := readsOf(h.fake).minus(before); got.full != 0 || got.bounded > 1 {
		t.Fatalf("the wait read %+v, want at most one bounded read", got)
	}
}

// TestRefusedDispatchLeavesNothingToWaitFor: T3 refuses message.dispatch. The
// caller gets T3's reason; a wait on the thread returns at once with what
// there is (idle for a new thread, the previous run's outcome for a follow-up)
// instead of waiting for a run that will never exist (issue 13.1).
func TestRefusedDispatchLeavesNothingToWaitFor(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("refused")
	const reason = "Provider instance codex is not ready to take messages."
	h.fake.RefuseDispatch(reason)
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone}, reason, "t3_wait on it returns idle")
	ids := h.fake.ThreadIDs()
	if len(ids) != 1 {
		t.Fatalf("threads %v", ids)
	}
	if r := c.ok("t3_wait", map[string]any{"thread_id": ids[0], "timeout": 600}); str(r, "reason") != "idle" {
		t.Fatalf("wait on the thread of a refused first prompt: %v", r)
	}

	h.fake.RefuseDispatch("")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": ids[0], "prompt": promptDone})
	h.fake.StepAll()
	if r := c.ok("t3_wait", map[string]any{"thread_id": ids[0], "timeout": 60}); str(r, "reason") != "completed" {
		t.Fatalf("wait %v", r)
	}
	h.fake.RefuseDispatch(reason)
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": ids[0], "prompt": "again"}, reason, "nothing was started")
	r := c.ok("t3_wait", map[string]any{"thread_id": ids[0], "timeout": 600})
	if str(r, "reason") != "completed" || str(r, "state", "latest_run", "id") != str(d, "run_id") {
		t.Fatalf("wait after a refused follow-up: %v", r)
	}
}

// TestBoundedRouteMissingFallsBack: a machine without /bounded (older builds
// answer 404 or 503 there) is read whole instead; a thread that does not
// exist is still an error, not a fallback.
func TestBoundedRouteMissingFallsBack(t *testing.T) {
	for _, status := range []int{404, 503} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			leakCheck(t)
			fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
			fk.AddProject("api", "/srv/api")
			// Every t3_thread reads: a thread's subscription could answer it.
			h := newHarness(t, harnessOpts{fake: fk, settings: func(s *app.Settings) { s.ThreadFeeds = 0 }})
			h.waitOnline("mac")
			c := h.client("fallback")
			d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
			h.fake.StepAll()
			rowCaughtUp(t, h, str(d, "thread_id"), c.ok("t3_wait", map[string]any{"thread_id": str(d, "thread_id"), "timeout": 60}))
			h.fake.BoundedRoute(status)
			before := readsOf(h.fake)
			st := c.ok("t3_thread", map[string]any{"thread_id": str(d, "thread_id")})
			if str(st, "status") != "completed" || !strings.Contains(dump(st, "runs"), "Done: "+promptDone) {
				t.Fatalf("t3_thread %v", st)
			}
			if got := readsOf(h.fake).minus(before); got.bounded != 1 || got.full != 1 {
				t.Fatalf("reads %+v, want the bounded try and one full read", got)
			}
			// Remembered: the next read goes straight to the full route.
			before = readsOf(h.fake)
			c.ok("t3_wait", map[string]any{"thread_id": str(d, "thread_id"), "timeout": 5})
			if got := readsOf(h.fake).minus(before); got.bounded != 0 || got.full != 1 {
				t.Fatalf("reads after the fallback %+v", got)
			}
		})
	}
}

// TestArchivedWhileWaiting: a thread archived while a wait is on it ends the
// wait with reason archived, not a timeout (issue 13.6).
func TestArchivedWhileWaiting(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("archive")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptHang})
	h.fake.StepAll()
	done := waitAsync(c, map[string]any{"thread_id": str(d, "thread_id"), "timeout": 3600})
	eventually(t, 10*time.Second, "the wait to block", func() bool { return h.app.Deps.ActiveWaits() == 1 }, nil)
	if !h.fake.ArchiveThread(str(d, "thread_id")) {
		t.Fatal("archive refused")
	}
	res := <-done
	if str(res, "reason") != "archived" {
		t.Fatalf("wait result %v", res)
	}
	eventually(t, 10*time.Second, "the wait slot to be free", func() bool { return h.app.Deps.ActiveWaits() == 0 }, nil)
}

// TestArchivedBeforeWait: t3_wait on a thread archived before the call —
// before the connector ever connected (it is then only in T3's archived list)
// or while it ran — answers archived at once with the thread's state, never
// "not found"; t3_thread on it says it is archived. A thread of a project no
// allowlist admits stays "not found", archived or not.
func TestArchivedBeforeWait(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	hidden := fk.AddProject("secret", "/srv/secret")
	early := fk.AddThread(pid, "archived before start", "completed")
	secret := fk.AddThread(hidden, "hidden", "completed")
	if !fk.ArchiveThread(early) || !fk.ArchiveThread(secret) {
		t.Fatal("archive refused")
	}
	h := newHarness(t, harnessOpts{fake: fk, projects: `["api"]`})
	h.waitOnline("mac")
	c := h.client("archived")

	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "finish quickly"})
	late := str(d, "thread_id")
	h.fake.StepAll()
	c.ok("t3_wait", map[string]any{"thread_id": late, "timeout": 30})
	if !h.fake.ArchiveThread(late) {
		t.Fatal("archive refused")
	}
	eventually(t, 10*time.Second, "the watcher to see the archive", func() bool {
		where, gone := h.app.Fleet.Machines()[0].Watcher().Gone(late)
		return gone && where == "archive"
	}, nil)

	for _, id := range []string{early, late} {
		res := c.ok("t3_wait", map[string]any{"thread_id": id, "timeout": 3600})
		if str(res, "reason") != "archived" || dump(res, "state", "thread_id") != id {
			t.Fatalf("t3_wait on %s archived before the call: %v", id, res)
		}
		c.fails("t3_thread", map[string]any{"thread_id": id}, "archived", id, `machine "mac"`)
	}
	res := c.ok("t3_wait", map[string]any{"thread_ids": []string{early, late}, "timeout": 3600})
	if str(res, "reason") != "archived" {
		t.Fatalf("t3_wait on several archived threads: %v", res)
	}
	c.fails("t3_wait", map[string]any{"thread_id": secret, "timeout": 5}, "not found")
	if h.app.Deps.ActiveWaits() != 0 {
		t.Fatalf("%d waits still counted", h.app.Deps.ActiveWaits())
	}
}

// dump is the value at path, printed (for lists and objects).
func dump(m map[string]any, path ...string) string {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = mm[p]
	}
	return fmt.Sprint(cur)
}

// feedsClosed waits until no wait holds a thread subscription, on either side.
func feedsClosed(t *testing.T, h *harness) {
	t.Helper()
	eventually(t, 10*time.Second, "the thread subscriptions to close", func() bool {
		return h.app.Fleet.WaitFeeds() == 0 && h.fake.Stats().ThreadStreams == 0
	}, func() string {
		return fmt.Sprintf("feeds %d, streams on T3 %d", h.app.Fleet.WaitFeeds(), h.fake.Stats().ThreadStreams)
	})
}

// rowCaughtUp waits until the machine's watcher shows the row a wait result
// res was judged from (its status; a question's pending request): a wait
// woken by the thread's subscription can return before the shell stream
// brings that row, and a second wait meant to find the run settled would
// otherwise block.
func rowCaughtUp(t *testing.T, h *harness, tid string, res map[string]any) {
	t.Helper()
	eventually(t, 10*time.Second, "the watcher's row to show what the result said", func() bool {
		row, _ := h.app.Fleet.Machines()[0].Watcher().Thread(tid)
		_, asks := row.PendingRuntimeRequest.Get()
		settled := str(res, "reason") != "question"
		return row.Status == str(res, "state", "status") && asks != settled && (row.ActiveRunId.Or("") == "") == settled
	}, nil)
}

// blockedWait starts t3_wait on tid and returns once it blocks with its
// thread's subscription open.
func blockedWait(t *testing.T, h *harness, c *client, tid string, streams int64) chan map[string]any {
	t.Helper()
	done := waitAsync(c, map[string]any{"thread_id": tid, "timeout": 60})
	eventually(t, 10*time.Second, "the wait to block on a subscription", func() bool {
		return h.fake.Stats().ThreadStreams == streams
	}, nil)
	return done
}

// TestWaitResultFromTheFeedSaysWhatTheReadSays: for each way a run ends
// (completed, failed, interrupted, a question), the result rendered from the
// thread's subscription is the result a read renders: the same wait again
// on the settled run (which ends at once and reads) answers the same state.
// Neither result's read count is left to chance: the first reads nothing,
// the second once.
func TestWaitResultFromTheFeedSaysWhatTheReadSays(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("same")
	for _, tc := range []struct{ prompt, reason string }{
		{promptDone, "completed"}, {promptFail, "failed"}, {promptQuestion, "question"}, {promptHang, "interrupted"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": tc.prompt})
			tid := str(d, "thread_id")
			done := blockedWait(t, h, c, tid, 1)
			before := readsOf(h.fake)
			h.fake.StepAll()
			if tc.reason == "interrupted" {
				c.ok("t3_interrupt", map[string]any{"thread_id": tid})
				before = readsOf(h.fake) // the interrupt's own state read is not the wait's
				h.fake.StepAll()
			}
			fromFeed := <-done
			if got := readsOf(h.fake).minus(before); got != (threadReads{}) {
				t.Fatalf("the result read %+v, want none", got)
			}
			if str(fromFeed, "reason") != tc.reason {
				t.Fatalf("wait result %v", fromFeed)
			}
			feedsClosed(t, h)
			rowCaughtUp(t, h, tid, fromFeed)
			before = readsOf(h.fake)
			fromRead := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 5})
			if got := readsOf(h.fake).minus(before); got != (threadReads{bounded: 1}) {
				t.Fatalf("the wait on the settled run read %+v, want one bounded read", got)
			}
			if a, b := dump(fromFeed), dump(fromRead); a != b {
				t.Fatalf("from the subscription:\n%s\nfrom the read:\n%s", a, b)
			}
		})
	}
}

// TestWaitResultFallsBackToTheRead: when the thread's subscription fails, or
// lags behind the row that said the run settled, the result reads the
// thread once, as it did before subscriptions, and says the same.
func TestWaitResultFallsBackToTheRead(t *testing.T) {
	for _, fault := range []string{"fails", "lags"} {
		t.Run(fault, func(t *testing.T) {
			leakCheck(t)
			h := manualHarness(t)
			c := h.client("fallback")
			d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
			tid := str(d, "thread_id")
			var done chan map[string]any
			if fault == "fails" {
				h.fake.FailThreadSubscriptions(true)
				done = waitAsync(c, map[string]any{"thread_id": tid, "timeout": 60})
				eventually(t, 10*time.Second, "the wait to block", func() bool { return h.app.Deps.ActiveWaits() == 1 }, nil)
			} else {
				h.fake.StallThreadStreams(true)
				done = blockedWait(t, h, c, tid, 1)
			}
			before := readsOf(h.fake)
			h.fake.StepAll()
			res := <-done
			if got := readsOf(h.fake).minus(before); got != (threadReads{bounded: 1}) {
				t.Fatalf("the result read %+v, want one bounded read", got)
			}
			if str(res, "reason") != "completed" || !strings.Contains(dump(res, "state", "runs"), "Done: "+promptDone) {
				t.Fatalf("wait result %v", res)
			}
			h.fake.FailThreadSubscriptions(false)
			h.fake.StallThreadStreams(false)
			feedsClosed(t, h)
		})
	}
}

// TestALaggingFeedStillRacesTheRead: a subscription behind the row races the
// result's read; when it catches up while the read hangs, the result comes
// from it (the read is given up), the same as a read would say.
func TestALaggingFeedStillRacesTheRead(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("race")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	tid := str(d, "thread_id")
	h.fake.StallThreadStreams(true)
	h.fake.HangThreadReads(tid, true)
	done := blockedWait(t, h, c, tid, 1)
	before := readsOf(h.fake)
	h.fake.StepAll()
	eventually(t, 10*time.Second, "the result's read to start", func() bool { return readsOf(h.fake).minus(before).bounded == 1 }, nil)
	h.fake.StallThreadStreams(false)
	res := <-done
	h.fake.HangThreadReads(tid, false)
	if str(res, "reason") != "completed" || !strings.Contains(dump(res, "state", "runs"), "Done: "+promptDone) {
		t.Fatalf("wait result %v", res)
	}
	if got := h.metric(`t3code_mcp_wait_result_seconds_count{stage="feed"}`); got != "1" {
		t.Fatalf("results from the feed: %q, want 1", got)
	}
	feedsClosed(t, h)
}

// TestWaitFeedsAreSharedAndCapped: two waits on one thread share one
// subscription, closed when the last leaves; beyond T3CODE_MCP_MAX_WAIT_FEEDS
// a wait has none and its result reads.
func TestWaitFeedsAreSharedAndCapped(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk, settings: func(s *app.Settings) { s.MaxWaitFeeds = 1 }})
	h.waitOnline("mac")
	c := h.client("shared")
	a := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	b := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	w1 := blockedWait(t, h, c, str(a, "thread_id"), 1)
	w2 := waitAsync(c, map[string]any{"thread_id": str(a, "thread_id"), "timeout": 60})
	w3 := waitAsync(c, map[string]any{"thread_id": str(b, "thread_id"), "timeout": 60}) // over the cap
	eventually(t, 10*time.Second, "the waits to block", func() bool { return h.app.Deps.ActiveWaits() == 3 }, nil)
	if n, open := h.app.Fleet.WaitFeeds(), h.fake.Stats().ThreadStreams; n != 1 || open != 1 {
		t.Fatalf("three waits on two threads, cap 1: %d feeds, %d streams on T3; want 1 shared", n, open)
	}
	before := readsOf(h.fake)
	h.fake.StepAll()
	for _, w := range []chan map[string]any{w1, w2, w3} {
		if r := <-w; str(r, "reason") != "completed" {
			t.Fatalf("wait result %v", r)
		}
	}
	if got := readsOf(h.fake).minus(before); got != (threadReads{bounded: 1}) {
		t.Fatalf("the results read %+v, want one bounded read (the wait over the cap)", got)
	}
	feedsClosed(t, h)
}

// TestWaitAnyResultsFromTheFeeds: t3_wait with thread_ids subscribes to each
// thread it blocks on; the first to settle answers from its subscription, a
// timeout from theirs, without a read; every subscription closes with the call.
func TestWaitAnyResultsFromTheFeeds(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("any")
	var ids []string
	for _, p := range []string{promptHang, promptDone, promptHang} {
		ids = append(ids, str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": p}), "thread_id"))
	}
	before := readsOf(h.fake)
	done := waitAsync(c, map[string]any{"thread_ids": ids, "timeout": 60})
	eventually(t, 10*time.Second, "a subscription per waited thread", func() bool { return h.fake.Stats().ThreadStreams == 3 }, nil)
	h.fake.StepAll()
	res := <-done
	if str(res, "reason") != "completed" || str(res, "state", "thread_id") != ids[1] {
		t.Fatalf("wait any %v", res)
	}
	feedsClosed(t, h)
	// The timeout's result is rendered from the feeds this wait opens: their snapshots must
	// come within the timeout, or the result reads (as it should). 1 s was too short on a
	// machine at load 15 (one bounded read seen); 5 s leaves them room.
	res = c.ok("t3_wait", map[string]any{"thread_ids": []string{ids[0], ids[2]}, "timeout": 5})
	if str(res, "reason") != "timeout" {
		t.Fatalf("wait any on the hanging threads %v", res)
	}
	if got := readsOf(h.fake).minus(before); got != (threadReads{}) {
		t.Fatalf("the waits read %+v, want none", got)
	}
	feedsClosed(t, h)
}

// TestWaitWokenByEitherStreamSaysTheSame: a wait is woken by whichever of
// the machine's shell stream and the thread's own subscription shows its run
// settle (or ask) first, and says the same either way: for each way a run
// ends, once with the shell stream held back (T3 holds its next chunk until
// the connector's Ack of the one before, which waits for a commit) so that
// the thread's subscription wakes the wait before the row arrives, and once
// with the subscription held back so that the row wakes it, the result is
// the result of a read of the same state. Woken by the feed, it reads
// nothing.
func TestWaitWokenByEitherStreamSaysTheSame(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("either")
	woken := map[string]int{}
	for _, tc := range []struct{ prompt, reason string }{
		{promptDone, "completed"}, {promptFail, "failed"}, {promptQuestion, "question"}, {promptHang, "interrupted"},
	} {
		for _, first := range []string{"feed", "shell"} {
			t.Run(tc.reason+"/"+first+" first", func(t *testing.T) {
				d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": tc.prompt})
				tid := str(d, "thread_id")
				done := blockedWait(t, h, c, tid, 1)
				if tc.reason == "interrupted" {
					h.fake.StepAll() // the run parks; the interrupt ends it at the next step
					c.ok("t3_interrupt", map[string]any{"thread_id": tid})
				}
				before := readsOf(h.fake)
				t.Cleanup(func() {
					h.fake.StallShellStreams(false)
					h.fake.StallThreadStreams(false)
					h.fake.HangThreadReads(tid, false)
				})
				if first == "feed" {
					h.fake.StallShellStreams(true)
				} else {
					h.fake.StallThreadStreams(true)
					h.fake.HangThreadReads(tid, true) // the result then comes from the subscription too
				}
				h.fake.StepAll()
				if first == "shell" {
					eventually(t, 10*time.Second, "the row to wake the wait", func() bool {
						return h.metric(`t3code_mcp_wait_woken_seconds_count{by="shell"}`) == fmt.Sprint(woken["shell"]+1)
					}, nil)
					h.fake.StallThreadStreams(false)
				}
				res := <-done
				h.fake.StallShellStreams(false)
				h.fake.HangThreadReads(tid, false)
				woken[first]++
				for _, by := range []string{"feed", "shell"} {
					if got, want := h.metric(`t3code_mcp_wait_woken_seconds_count{by="`+by+`"}`), fmt.Sprint(woken[by]); got != want && !(got == "" && want == "0") {
						t.Fatalf("waits woken by the %s: %q, want %s", by, got, want)
					}
				}
				if str(res, "reason") != tc.reason {
					t.Fatalf("wait result %v", res)
				}
				if got := readsOf(h.fake).minus(before); first == "feed" && got != (threadReads{}) {
					t.Fatalf("woken by the subscription, the result read %+v; want none", got)
				}
				feedsClosed(t, h)
				rowCaughtUp(t, h, tid, res)
				before = readsOf(h.fake)
				fromRead := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 5})
				if got := readsOf(h.fake).minus(before); got != (threadReads{bounded: 1}) {
					t.Fatalf("the wait on the settled run read %+v, want one bounded read", got)
				}
				if a, b := dump(res), dump(fromRead); a != b {
					t.Fatalf("woken by the %s first:\n%s\nfrom the read:\n%s", first, a, b)
				}
			})
		}
	}
}

// TestWaitFeedResubscribesWhenTheSocketComesBack: when the machine's socket
// drops and comes back while a wait blocks, the wait's thread subscription is
// made again on the new socket (it used to fail, and the result then read the
// thread): the run's settle still wakes the wait from it, before the row,
// and the result reads nothing.
func TestWaitFeedResubscribesWhenTheSocketComesBack(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("drop")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	tid := str(d, "thread_id")
	done := blockedWait(t, h, c, tid, 1)
	sockets := h.fake.Stats().WSConnections
	h.fake.DropConnections()
	eventually(t, 10*time.Second, "the machine back with the wait's subscription on the new socket", func() bool {
		st := h.fake.Stats()
		return st.WSConnections > sockets && st.ThreadStreams == 1 && h.app.Fleet.Machines()[0].Info().Online
	}, nil)
	before := readsOf(h.fake)
	h.fake.StallShellStreams(true) // only the subscription can wake the wait
	t.Cleanup(func() { h.fake.StallShellStreams(false) })
	h.fake.StepAll()
	res := <-done
	h.fake.StallShellStreams(false)
	if str(res, "reason") != "completed" || !strings.Contains(dump(res, "state", "runs"), "Done: "+promptDone) {
		t.Fatalf("wait result %v", res)
	}
	if got := readsOf(h.fake).minus(before); got != (threadReads{}) {
		t.Fatalf("the result read %+v, want none: it comes from the subscription made again", got)
	}
	if got := h.metric(`t3code_mcp_wait_woken_seconds_count{by="feed"}`); got != "1" {
		t.Fatalf("waits woken by the subscription: %q, want 1", got)
	}
	feedsClosed(t, h)
}

// TestActingRightAfterAFeedWokenWaitFindsTheRow: a t3_wait woken by its thread's subscription
// returns the question before the watcher has the row that asks it (the shell stream is held
// back here); a t3_answer called right then waits for that row (fleet.Machine.ExpectRow)
// instead of answering "no pending question", and succeeds once the row comes.
func TestActingRightAfterAFeedWokenWaitFindsTheRow(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("act")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptQuestion})
	tid := str(d, "thread_id")
	done := blockedWait(t, h, c, tid, 1)
	h.fake.StallShellStreams(true) // only the subscription can wake the wait
	t.Cleanup(func() { h.fake.StallShellStreams(false) })
	h.fake.StepAll()
	res := <-done
	if str(res, "reason") != "question" {
		t.Fatalf("wait result %v", res)
	}
	if got := h.metric(`t3code_mcp_wait_woken_seconds_count{by="feed"}`); got != "1" {
		t.Fatalf("waits woken by the subscription: %q, want 1", got)
	}
	m := h.app.Fleet.Machines()[0]
	if row, _ := m.Watcher().Thread(tid); func() bool { _, asks := row.PendingRuntimeRequest.Get(); return asks }() {
		t.Fatalf("the watcher's row already asks (%+v): the shell stream was not held back", row)
	}
	type answer struct {
		text  string
		isErr bool
	}
	answered := make(chan answer, 1)
	go func() {
		_, text, isErr := c.call("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"scope": "Workspace", "checks": []any{"lint"}}})
		answered <- answer{text, isErr}
	}()
	eventually(t, 10*time.Second, "t3_answer to wait for the row that asks", func() bool { return m.RowCatchUps() == 1 }, nil)
	h.fake.StallShellStreams(false)
	if a := <-answered; a.isErr {
		t.Fatalf("t3_answer right after the wait failed: %s", a.text)
	}
}

// A wait woken by the thread's subscription on a run whose start the watcher's row has not even
// shown (the shell stream held back from before the continuation was sent): the row then says
// "no active run", as it did after the previous run, and the next lookup must still wait for the
// row that shows this run over, not take the older row for it.
func TestLookupAfterAFeedWokenWaitWaitsForARowThatKnowsTheRun(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("cont")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	tid := str(d, "thread_id")
	done := blockedWait(t, h, c, tid, 1)
	h.fake.StepAll()
	if res := <-done; str(res, "reason") != "completed" {
		t.Fatalf("first wait %v", res)
	}
	m := h.app.Fleet.Machines()[0]
	eventually(t, 10*time.Second, "the row to show the first run over", func() bool {
		row, _ := m.Watcher().Thread(tid)
		return threadstate.LatestRun(&row) == str(d, "run_id") && threadstate.ActiveRun(&row) == ""
	}, nil)

	h.fake.StallShellStreams(true) // the row stays as the first run left it
	t.Cleanup(func() { h.fake.StallShellStreams(false) })
	eventually(t, 10*time.Second, "the first wait's subscription to close", func() bool { return h.fake.Stats().ThreadStreams == 0 }, nil)
	feedWoken := h.metric(`t3code_mcp_wait_woken_seconds_count{by="feed"}`)
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": promptDone})
	done = blockedWait(t, h, c, tid, 1)
	h.fake.StepAll()
	res := <-done
	run2 := str(res, "run_id")
	if str(res, "reason") != "completed" || run2 == "" || run2 == str(d, "run_id") {
		t.Fatalf("second wait %v, want the second run completed", res)
	}
	if got := h.metric(`t3code_mcp_wait_woken_seconds_count{by="feed"}`); got == feedWoken {
		t.Fatalf("waits woken by the subscription: still %q: the second wait was not", got)
	}
	if row, _ := m.Watcher().Thread(tid); threadstate.LatestRun(&row) == run2 {
		t.Fatalf("the watcher's row already knows run %s: the shell stream was not held back", run2)
	}
	looked := make(chan string, 1)
	go func() {
		_, text, _ := c.call("t3_interrupt", map[string]any{"thread_id": tid})
		looked <- text
	}()
	eventually(t, 10*time.Second, "the lookup to wait for the row that shows the run over", func() bool { return m.RowCatchUps() == 1 }, nil)
	h.fake.StallShellStreams(false)
	<-looked
}
