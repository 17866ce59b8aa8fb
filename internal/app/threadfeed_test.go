package app_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// cachedAndReading are two connectors on one fake machine whose runs move
// only when the test steps them: one keeps the threads t3_thread reads
// current from their subscriptions (the default), the other has none
// (T3CODE_MCP_THREAD_FEEDS=0) and reads on every call.
func cachedAndReading(t *testing.T) (fk *t3fake.Server, pid string, cached, reading *harness) {
	t.Helper()
	fk = t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true, KeepRuns: -1})
	pid = fk.AddProject("api", "/srv/api")
	cached = newHarness(t, harnessOpts{fake: fk})
	reading = newHarness(t, harnessOpts{fake: fk, settings: func(s *app.Settings) { s.ThreadFeeds = 0 }})
	cached.waitOnline("mac")
	reading.waitOnline("mac")
	return fk, pid, cached, reading
}

// fromFeed calls t3_thread on the cached connector until a call is answered
// from the thread's subscription (no read of the thread; a call made while
// the feed is behind the row reads, which is allowed), and returns it.
func fromFeed(t *testing.T, fk *t3fake.Server, c *client, args map[string]any) map[string]any {
	t.Helper()
	var res map[string]any
	eventually(t, 10*time.Second, "a t3_thread answered from the feed", func() bool {
		before := readsOf(fk)
		res = c.ok("t3_thread", args)
		return readsOf(fk).minus(before) == threadReads{}
	}, nil)
	return res
}

// TestThreadFromTheFeedSaysWhatTheReadSays: t3_thread answered from the
// thread's lingering subscription says what a connector that reads says, at
// every step of new runs on a thread with history (a failure, a reply, a
// question pending; more runs than a feed holds, so it drops the older ones)
// and for every number of turns a feed can show. The first call on the
// thread reads once (and opens the subscription); later ones read nothing.
func TestThreadFromTheFeedSaysWhatTheReadSays(t *testing.T) {
	leakCheck(t)
	fk, pid, cached, reading := cachedAndReading(t)
	tid := fk.AddThread(pid, "cached", "idle")
	for _, prompt := range []string{promptDone, promptFail, promptDone, promptDone, promptFail} {
		if _, err := fk.StartRun(tid, prompt); err != nil {
			t.Fatal(err)
		}
		fk.StepAll()
	}
	c, r := cached.client("cached"), reading.client("reading")
	eventually(t, 10*time.Second, "both connectors to list the thread", func() bool {
		_, _, e1 := c.call("t3_thread", map[string]any{"thread_id": tid})
		_, _, e2 := r.call("t3_thread", map[string]any{"thread_id": tid})
		return !e1 && !e2
	}, nil)
	if n := cached.app.Fleet.ThreadFeeds(); n != 1 {
		t.Fatalf("%d thread feeds after the first t3_thread, want 1", n)
	}
	same := func(when string) {
		t.Helper()
		for turns := 1; turns <= 3; turns++ {
			args := map[string]any{"thread_id": tid, "turns": turns}
			var a, b string
			eventually(t, 10*time.Second, when+": the feed's answer to be the read's", func() bool {
				a = dump(fromFeed(t, fk, c, args))
				before := readsOf(fk)
				b = dump(r.ok("t3_thread", args))
				if got := readsOf(fk).minus(before); got != (threadReads{bounded: 1}) {
					t.Fatalf("the reading connector read %+v, want one bounded read", got)
				}
				return a == b
			}, func() string { return fmt.Sprintf("from the feed:\n%s\nfrom the read:\n%s", a, b) })
		}
	}
	same("history")
	for _, prompt := range []string{promptFail, promptDone, promptDone, promptQuestion} {
		if _, err := fk.StartRun(tid, prompt); err != nil {
			t.Fatal(err)
		}
		same(prompt + " started")
		for fk.Step() {
			same(prompt)
		}
	}
	if got := cached.metric(`t3code_mcp_thread_results_total{source="feed"}`); got == "" || got == "0" {
		t.Fatalf("t3_thread results from the feed: %q", got)
	}
}

// TestThreadFeedBehindOrDroppedIsNotServed: a thread's subscription that is
// behind the row (its stream stalled while the run went on) or whose socket
// dropped never answers t3_thread: the call reads, and says what T3 says.
func TestThreadFeedBehindOrDroppedIsNotServed(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	fk, c := h.fake, h.client("stale")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone}), "thread_id")
	fk.StepAll()
	args := map[string]any{"thread_id": tid}
	eventually(t, 10*time.Second, "the run to show done", func() bool {
		return strings.Contains(dump(c.ok("t3_thread", args)), "Done: "+promptDone)
	}, nil)
	fromFeed(t, fk, c, args)

	// Behind: the thread's stream stalls, the shell row moves on.
	fk.StallThreadStreams(true)
	if _, err := fk.StartRun(tid, promptFail); err != nil {
		t.Fatal(err)
	}
	fk.StepAll()
	// Watched without t3_thread: its read would bring the feed up to date.
	eventually(t, 10*time.Second, "the row to say failed", func() bool {
		found, err := h.app.Fleet.Thread(tid)
		return err == nil && found.Shell.Status == "failed"
	}, nil)
	before := readsOf(fk)
	res := c.ok("t3_thread", args)
	if got := readsOf(fk).minus(before); got != (threadReads{bounded: 1}) {
		t.Fatalf("a t3_thread with its feed behind the row read %+v, want one bounded read", got)
	}
	if !strings.Contains(dump(res, "runs"), "failed") || !strings.Contains(dump(res, "runs"), "Done: "+promptDone) {
		t.Fatalf("t3_thread with its feed behind: %v", res)
	}
	fk.StallThreadStreams(false)
	fromFeed(t, fk, c, args) // caught up again

	// Dropped: the machine's socket goes, and with it the subscription.
	fk.DropConnections()
	eventually(t, 10*time.Second, "the feed to end with its socket", func() bool {
		return h.app.Fleet.ThreadFeeds() == 0 || fk.Stats().ThreadStreams == 0
	}, nil)
	before = readsOf(fk)
	if _, _, isErr := c.call("t3_thread", args); !isErr {
		// A new subscription may be in before the call looks; the old one
		// never answers.
		if got := readsOf(fk).minus(before); got.full != 0 || got.bounded > 1 {
			t.Fatalf("the first t3_thread after the socket dropped read %+v, want at most one bounded read", got)
		}
	}
	h.waitOnline("mac")
	fromFeed(t, fk, c, args) // a new subscription
}

// TestThreadFeedsLingerBoundedAndExpire: a thread t3_thread read keeps its
// subscription (one, however many calls); at most T3CODE_MCP_THREAD_FEEDS
// linger, the least recently used let go first; an idle one is let go after
// T3CODE_MCP_THREAD_FEED_IDLE, and the next call reads and opens it again.
func TestThreadFeedsLingerBoundedAndExpire(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	a, b := fk.AddThread(pid, "a", "idle"), fk.AddThread(pid, "b", "idle")
	h := newHarness(t, harnessOpts{fake: fk, settings: func(s *app.Settings) { s.ThreadFeeds, s.ThreadFeedIdle = 1, time.Hour }})
	h.waitOnline("mac")
	c := h.client("linger")
	streams := func() int64 { return fk.Stats().ThreadStreams }
	eventually(t, 10*time.Second, "thread a to be listed", func() bool {
		_, _, isErr := c.call("t3_thread", map[string]any{"thread_id": a})
		return !isErr
	}, nil)
	fromFeed(t, fk, c, map[string]any{"thread_id": a})
	fromFeed(t, fk, c, map[string]any{"thread_id": a})
	if n := streams(); n != 1 {
		t.Fatalf("%d thread streams on T3 after three t3_thread on one thread, want 1", n)
	}
	// The cap is 1: thread b's feed takes thread a's place.
	eventually(t, 10*time.Second, "thread b to be listed", func() bool {
		_, _, isErr := c.call("t3_thread", map[string]any{"thread_id": b})
		return !isErr
	}, nil)
	fromFeed(t, fk, c, map[string]any{"thread_id": b})
	eventually(t, 10*time.Second, "thread a's stream to close", func() bool { return streams() == 1 }, nil)
	if n := h.app.Fleet.ThreadFeeds(); n != 1 {
		t.Fatalf("%d thread feeds with a cap of 1", n)
	}
	// a again: a new subscription (b's is let go), reading at most once
	// meanwhile (the new one may be in before the call looks).
	before := readsOf(fk)
	c.ok("t3_thread", map[string]any{"thread_id": a})
	if got := readsOf(fk).minus(before); got.full != 0 || got.bounded > 1 {
		t.Fatalf("t3_thread on the thread let go read %+v, want at most one bounded read", got)
	}
	fromFeed(t, fk, c, map[string]any{"thread_id": a})
	eventually(t, 10*time.Second, "thread b's stream to close", func() bool { return streams() == 1 }, nil)
}

// TestIdleThreadFeedsAreLetGo: with a short idle time, a thread's
// subscription closes on its own after its last t3_thread.
func TestIdleThreadFeedsAreLetGo(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	tid := fk.AddThread(pid, "idle", "idle")
	h := newHarness(t, harnessOpts{fake: fk, settings: func(s *app.Settings) { s.ThreadFeedIdle = 50 * time.Millisecond }})
	h.waitOnline("mac")
	c := h.client("idle")
	eventually(t, 10*time.Second, "the thread to be listed", func() bool {
		_, _, isErr := c.call("t3_thread", map[string]any{"thread_id": tid})
		return !isErr
	}, nil)
	eventually(t, 10*time.Second, "the idle feed to be let go", func() bool {
		return h.app.Fleet.ThreadFeeds() == 0 && fk.Stats().ThreadStreams == 0
	}, nil)
}
