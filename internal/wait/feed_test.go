package wait

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// feed is a Feed whose projection the test sets, waking lookers as a
// threadfeed.Feed does at each applied chunk. Look holds its lock while the
// waiter judges, so a state set after the waiter looked at the one before is
// seen only once that judgement is over.
type feed struct {
	mu      sync.Mutex
	p       *t3api.ThreadProjection
	err     error
	changed chan struct{}
	looks   int
}

func newFeed() *feed { return &feed{changed: make(chan struct{})} }

func (f *feed) Look(see func(*t3api.ThreadProjection)) (<-chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.looks++
	if f.err != nil {
		return nil, f.err
	}
	if f.p != nil {
		see(f.p)
	}
	return f.changed, nil
}

func (f *feed) set(p *t3api.ThreadProjection, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.p, f.err = p, err
	close(f.changed)
	f.changed = make(chan struct{})
}

// looked waits until the waiter has looked at the feed n times in all.
func (f *feed) looked(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		looks := f.looks
		f.mu.Unlock()
		if looks >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter looked at the feed %d times, want %d", looks, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// proj is a projection of thread t1: runs as id:status in ordinal order,
// then the requests pending and the timeline rows of requests.
type proj struct {
	runs     [][2]string // id, status
	msgs     []string    // the user message of each run ("" for none)
	pending  []t3api.RuntimeRequest
	rows     []string // request ids with a timeline row
	archived bool
}

func (x proj) build() *t3api.ThreadProjection {
	p := &t3api.ThreadProjection{Thread: t3api.AppThread{ID: "t1", Title: "feed"}}
	for i, r := range x.runs {
		run := t3api.Run{ID: r[0], Ordinal: int64(i + 1), Status: r[1]}
		if i < len(x.msgs) && x.msgs[i] != "" {
			run.UserMessageId = t3api.NewOptNilString(x.msgs[i])
		}
		p.Runs = append(p.Runs, run)
	}
	if x.archived {
		p.Thread.ArchivedAt = t3api.NewOptNilString("2026-12-01T00:00:00Z")
	}
	p.RuntimeRequests = x.pending
	for _, id := range x.rows {
		p.TurnItems = append(p.TurnItems, t3api.TurnItem{ID: "item:" + id, Type: "user_input_request", RequestId: t3api.NewOptString(id)})
	}
	return p
}

func pendingReq(id string) t3api.RuntimeRequest {
	return t3api.RuntimeRequest{ID: id, Kind: "user_input", Status: "pending"}
}

// blockedOnFeed starts a wait on t1 (its row: run-2 running) that blocks with
// f as its feed, and returns once the waiter has looked at f.
func blockedOnFeed(t *testing.T, src *rows, f *feed, target Target, read Reader) chan result {
	t.Helper()
	target.ThreadID = "t1"
	ch := start(context.Background(), src, target, Options{Read: read, Blocked: func() Feed { return f }})
	f.looked(t, 1)
	return ch
}

// TestFeedWakesTheWaitForItsRunOnly: the thread's subscription wakes a wait
// as soon as it shows the waited run settled, with what the row would say
// (the run's status as the row's, run pointers, no question), before the row
// itself changed; a projection that shows only an older run settled (a
// snapshot taken before the run started) or the run still going does not
// wake it.
func TestFeedWakesTheWaitForItsRunOnly(t *testing.T) {
	for status, want := range map[string]Reason{"completed": Completed, "failed": Failed, "interrupted": Interrupted, "cancelled": Interrupted} {
		t.Run(status, func(t *testing.T) {
			src, f := newRows(), newFeed()
			src.put(row{status: "running", active: "run-2", latest: "run-2"})
			ch := blockedOnFeed(t, src, f, Target{RunID: "run-2"}, nil)
			f.set(proj{runs: [][2]string{{"run-1", "completed"}}}.build(), nil) // before run-2 existed
			f.looked(t, 2)
			f.set(proj{runs: [][2]string{{"run-1", "completed"}, {"run-2", "running"}}}.build(), nil)
			f.looked(t, 3)
			f.set(proj{runs: [][2]string{{"run-1", "completed"}, {"run-2", status}}}.build(), nil)
			r := receive(t, ch)
			if r.err != nil || r.r.Reason != want || r.r.RunID != "run-2" || r.r.RunStatus != status || r.r.WokenBy != ByFeed || r.r.Reads != 0 {
				t.Fatalf("got %+v %v; want %s of run-2 from the feed", r.r, r.err, want)
			}
			sh := r.r.Shell
			if sh.ID != "t1" || sh.Status != status || sh.LatestRunId.Or("") != "run-2" || !sh.ActiveRunId.Null || !sh.PendingRuntimeRequest.Null || sh.Title != "feed" {
				t.Fatalf("the row the result was judged from: %+v", sh)
			}
		})
	}
}

// TestFeedAndRowGiveTheSameResult: the same settle seen first in the row or
// first in the feed ends the wait with the same result (reason, run, status,
// question), whichever stream woke it.
func TestFeedAndRowGiveTheSameResult(t *testing.T) {
	ask := &t3rpc.PendingRuntimeRequest{ID: "req-1", Kind: "user_input"}
	for _, tc := range []struct {
		name string
		row  row
		proj proj
	}{
		{"completed", row{status: "completed", latest: "run-2"}, proj{runs: [][2]string{{"run-1", "completed"}, {"run-2", "completed"}}}},
		{"failed", row{status: "failed", latest: "run-2"}, proj{runs: [][2]string{{"run-2", "failed"}}}},
		{"question", row{status: "running", active: "run-2", latest: "run-2", pending: ask},
			proj{runs: [][2]string{{"run-2", "running"}}, pending: []t3api.RuntimeRequest{pendingReq("req-1")}, rows: []string{"req-1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [2]Result
			for i, byFeed := range []bool{false, true} {
				src, f := newRows(), newFeed()
				src.put(row{status: "running", active: "run-2", latest: "run-2"})
				ch := blockedOnFeed(t, src, f, Target{RunID: "run-2"}, nil)
				if byFeed {
					f.set(tc.proj.build(), nil)
				} else {
					src.put(tc.row)
				}
				r := receive(t, ch)
				if r.err != nil {
					t.Fatal(r.err)
				}
				if want := map[bool]WokenBy{false: ByShell, true: ByFeed}[byFeed]; r.r.WokenBy != want {
					t.Fatalf("woken by %q, want %q", r.r.WokenBy, want)
				}
				got[i] = r.r
			}
			row, feed := got[0], got[1]
			if row.Reason != feed.Reason || row.RunID != feed.RunID || row.RunStatus != feed.RunStatus || row.RequestID != feed.RequestID ||
				row.Shell.Status != feed.Shell.Status || row.Shell.PendingRuntimeRequest.Value.ID != feed.Shell.PendingRuntimeRequest.Value.ID {
				t.Fatalf("woken by the row: %+v\nwoken by the feed: %+v", row, feed)
			}
		})
	}
}

// TestFeedLeavesToTheRowWhatItCannotTell: where the projection does not
// decide what the row would (a later run queued behind the waited one, a
// request pending with no run underway, two requests pending, a question
// without its timeline row yet, a question answered through this
// connector, the thread archived), the feed does not wake the wait; the row
// still does.
func TestFeedLeavesToTheRowWhatItCannotTell(t *testing.T) {
	for _, tc := range []struct {
		name string
		proj proj
	}{
		{"a later run queued behind", proj{runs: [][2]string{{"run-2", "completed"}, {"run-3", "queued"}}}},
		{"a request pending, nothing underway", proj{runs: [][2]string{{"run-2", "interrupted"}}, pending: []t3api.RuntimeRequest{pendingReq("req-1")}, rows: []string{"req-1"}}},
		{"two requests pending", proj{runs: [][2]string{{"run-2", "running"}}, pending: []t3api.RuntimeRequest{pendingReq("req-1"), pendingReq("req-2")}, rows: []string{"req-1", "req-2"}}},
		{"a question without its row", proj{runs: [][2]string{{"run-2", "running"}}, pending: []t3api.RuntimeRequest{pendingReq("req-1")}}},
		{"a question answered here", proj{runs: [][2]string{{"run-2", "running"}}, pending: []t3api.RuntimeRequest{pendingReq("req-0")}, rows: []string{"req-0"}}},
		{"the thread archived", proj{runs: [][2]string{{"run-2", "failed"}}, archived: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, f := newRows(), newFeed()
			src.put(row{status: "running", active: "run-2", latest: "run-2"})
			ch := blockedOnFeed(t, src, f, Target{RunID: "run-2", Answered: map[string]bool{"req-0": true}}, nil)
			f.set(tc.proj.build(), nil)
			f.looked(t, 2)
			src.put(row{status: "completed", latest: "run-2"}) // the row decides
			r := receive(t, ch)
			if r.err != nil || r.r.Reason != Completed || r.r.WokenBy != ByShell {
				t.Fatalf("got %+v %v; want completed, woken by the row", r.r, r.err)
			}
		})
	}
}

// TestFeedFindsTheRunOfTheMessage: a wait for the run of a dispatched message
// (its run not known yet) learns the run from the feed by the message, never
// taking an earlier run for it, and is woken when that run settles.
func TestFeedFindsTheRunOfTheMessage(t *testing.T) {
	src, f, rs := newRows(), newFeed(), &runs{}
	rs.put("m1", "run-1", "running")
	src.put(row{status: "running", active: "run-1", latest: "run-1"}) // the message's run not made yet
	ch := blockedOnFeed(t, src, f, Target{MessageID: "m2"}, rs.read)
	f.set(proj{runs: [][2]string{{"run-1", "completed"}}, msgs: []string{"m1"}}.build(), nil)
	f.looked(t, 2)
	f.set(proj{runs: [][2]string{{"run-1", "completed"}, {"run-2", "failed"}}, msgs: []string{"m1", "m2"}}.build(), nil)
	r := receive(t, ch)
	if r.err != nil || r.r.Reason != Failed || r.r.RunID != "run-2" || r.r.WokenBy != ByFeed || r.r.Reads != 1 {
		t.Fatalf("got %+v %v; want run-2 failed from the feed after the wait's one read", r.r, r.err)
	}
}

// TestAStoppedFeedLeavesTheRow: a feed that stopped (its stream failed) no
// longer wakes the wait; the row does.
func TestAStoppedFeedLeavesTheRow(t *testing.T) {
	src, f := newRows(), newFeed()
	src.put(row{status: "running", active: "run-2", latest: "run-2"})
	ch := blockedOnFeed(t, src, f, Target{RunID: "run-2"}, nil)
	f.set(nil, errors.New("stream failed"))
	f.looked(t, 2)
	src.put(row{status: "completed", latest: "run-2"})
	if r := receive(t, ch); r.err != nil || r.r.Reason != Completed || r.r.WokenBy != ByShell {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
}
