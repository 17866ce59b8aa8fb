package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// soakDuration is T3CODE_MCP_SOAK_DURATION (`make soak` sets minutes), else
// the short run of `make check`.
func soakDuration(t *testing.T) (time.Duration, bool) {
	v := os.Getenv("T3CODE_MCP_SOAK_DURATION")
	if v == "" {
		return 10 * time.Second, false
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("T3CODE_MCP_SOAK_DURATION=%q: want a duration", v)
	}
	return d, true
}

// rssKB reads VmRSS from /proc/self/status (0 where there is none).
func rssKB() int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

type sample struct {
	at         time.Duration
	rss        int
	goroutines int // all of them
	own        int // all but idle keep-alive HTTP connections (idleConnGoroutine)
	heapKB     uint64
}

// idleConnGoroutine says whether a goroutine's stack is one of the three an
// idle keep-alive HTTP connection holds inside this process: the client's
// read and write loops (net/http persistConn), and the server's conn
// goroutine while it waits for the next request. How many of those stay open
// is the transports' choice (idle connections per host, kept by the fleet's
// reads, the outbox's deliveries and the tests' own clients), not a leak; a
// server conn still running a handler is not idle and is counted.
func idleConnGoroutine(stack string) bool {
	if strings.Contains(stack, "net/http.(*persistConn).readLoop") || strings.Contains(stack, "net/http.(*persistConn).writeLoop") {
		return true
	}
	return strings.Contains(stack, "net/http.(*conn).serve") && strings.Contains(stack, "net/http.(*conn).readRequest")
}

// ownGoroutines counts the process's goroutines bar idle keep-alive HTTP
// connections.
func ownGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	own := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !idleConnGoroutine(g) {
			own++
		}
	}
	return own
}

func takeSample(start time.Time) sample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return sample{at: time.Since(start).Round(time.Second), rss: rssKB(), goroutines: runtime.NumGoroutine(), own: ownGoroutines(), heapKB: ms.HeapAlloc >> 10}
}

// safeCall runs a tool from any goroutine (no t.Fatal): the structured
// content, the text, and whether it failed.
func safeCall(s *mcp.ClientSession, name string, args map[string]any, timeout time.Duration) (map[string]any, string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, "protocol error: " + err.Error(), true
	}
	var sc map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &sc)
	return sc, resultText(res), res.IsError
}

// TestSoak runs dispatch → wait (→ answer / interrupt) cycles from several
// sessions against the fake, with the socket dropped every second, then
// checks that every run's events arrived once, that no goroutine was left
// behind, and reports RSS and goroutines sampled along the way. `make check`
// runs 10 s; `make soak` runs minutes (T3CODE_MCP_SOAK_DURATION).
func TestSoak(t *testing.T) {
	leakCheck(t)
	dur, long := soakDuration(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: 5 * time.Millisecond, KeepRuns: -1})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	hl.mu.Lock()
	hl.forget = true
	hl.mu.Unlock()
	h := newHarness(t, harnessOpts{fake: fk, settings: hl.settings})
	h.waitOnline("mac")

	const workers = 4
	type worker struct {
		c      *client
		thread string
	}
	ws := make([]*worker, workers)
	w := want{}
	for i := range ws {
		c := h.client(fmt.Sprintf("soak-%d", i))
		tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone + " first"}), "thread_id")
		c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30})
		w.add(tid, "thread.completed")
		ws[i] = &worker{c: c, thread: tid}
	}
	hl.settle(t, h, w)
	base := takeSample(time.Now())

	start := time.Now()
	stop := make(chan struct{})
	var drops, cycles, toolErrors atomic.Int64
	var mu sync.Mutex // guards w
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the socket drops every second
		defer wg.Done()
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				fk.DropConnections()
				drops.Add(1)
			}
		}
	}()
	// until retries a tool until it succeeds and cond holds (nil: any
	// success); outages make calls fail for a moment.
	until := func(s *mcp.ClientSession, name string, args map[string]any, cond func(map[string]any) bool) (map[string]any, bool) {
		for range 600 {
			sc, text, isErr := safeCall(s, name, args, 30*time.Second)
			if !isErr && (cond == nil || cond(sc)) {
				return sc, true
			}
			if isErr {
				toolErrors.Add(1)
				if strings.Contains(text, "internal error") {
					t.Errorf("%s: %s", name, text)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("%s(%v) never succeeded", name, args)
		return nil, false
	}
	settled := func(sc map[string]any) bool {
		r := str(sc, "reason")
		return r == "completed" || r == "failed" || r == "interrupted" || r == "question" || r == "timeout"
	}
	scripts := []string{promptDone, promptFail, promptQuestion, promptHang}
	for i, wk := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := wk.c.session
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				p := scripts[(i+n)%len(scripts)]
				args := map[string]any{"machine": "mac", "project": "api", "thread_id": wk.thread, "prompt": fmt.Sprintf("%s w%d n%d", p, i, n)}
				for {
					_, text, isErr := safeCall(s, "t3_dispatch", args, 30*time.Second)
					if !isErr {
						break
					}
					toolErrors.Add(1)
					// Sent before the reply was lost: T3 runs it already.
					if st, _ := fk.ThreadStatus(wk.thread); st != "completed" && st != "failed" && st != "interrupted" && st != "idle" {
						break
					}
					if !strings.Contains(text, "mac") {
						t.Errorf("unclear dispatch error: %s", text)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				wait := map[string]any{"thread_id": wk.thread, "timeout": 30}
				var types []string
				switch p {
				case promptQuestion:
					until(s, "t3_wait", wait, func(sc map[string]any) bool { return str(sc, "reason") == "question" })
					until(s, "t3_answer", map[string]any{"thread_id": wk.thread, "answers": map[string]any{"scope": "Session", "checks": []any{"test"}}}, nil)
					until(s, "t3_wait", wait, func(sc map[string]any) bool { return str(sc, "reason") == "completed" })
					types = []string{"thread.question", "thread.completed"}
				case promptHang:
					until(s, "t3_wait", map[string]any{"thread_id": wk.thread, "timeout": 1}, settled)
					until(s, "t3_interrupt", map[string]any{"thread_id": wk.thread}, nil)
					until(s, "t3_wait", wait, func(sc map[string]any) bool { return str(sc, "reason") == "interrupted" })
					types = []string{"thread.interrupted"}
				case promptFail:
					until(s, "t3_wait", wait, func(sc map[string]any) bool { return str(sc, "reason") == "failed" })
					types = []string{"thread.failed"}
				default:
					until(s, "t3_wait", wait, func(sc map[string]any) bool { return str(sc, "reason") == "completed" })
					types = []string{"thread.completed"}
				}
				mu.Lock()
				w.add(wk.thread, types...)
				mu.Unlock()
				cycles.Add(1)
			}
		}()
	}
	samples := []sample{base}
	every := 5 * time.Second
	if !long {
		every = 2 * time.Second
	}
	tk := time.NewTicker(every)
	for time.Since(start) < dur {
		<-tk.C
		s := takeSample(start)
		samples = append(samples, s)
		if long {
			t.Logf("SOAK t=%v rss=%dkB heap=%dkB goroutines=%d cycles=%d drops=%d state=%dkB tracked=%d", s.at, s.rss, s.heapKB, s.goroutines, cycles.Load(), drops.Load(), stateKB(h), trackedThreads(h))
		}
	}
	tk.Stop()
	close(stop)
	wg.Wait()
	h.waitOnline("mac")
	// A cycle whose dispatch failed mid-flight cannot tell whether T3 made a
	// run, so the count above is a guess; what T3 holds is the truth: one
	// event per settled run and one per question asked.
	w = wantFromT3(t, h, w)
	repeats := hl.settle(t, h, w)
	// Idle connections close asynchronously (the outbox drops its burst pool once its queue is
	// empty, just after the last outcome is on disk): sample until quiescent, within a safety net.
	end := takeSample(start)
	for deadline := time.Now().Add(10 * time.Second); end.own > base.own+4 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		end = takeSample(start)
	}
	t.Logf("SOAK %v: %d cycles, %d socket drops, %d events, %d redeliveries, %d tool errors retried; rss %d→%d kB, heap %d→%d kB, goroutines %d→%d (bar idle HTTP connections %d→%d)",
		dur, cycles.Load(), drops.Load(), countEvents(w), repeats, toolErrors.Load(), base.rss, end.rss, base.heapKB, end.heapKB, base.goroutines, end.goroutines, base.own, end.own)
	if cycles.Load() < workers {
		t.Errorf("only %d cycles in %v", cycles.Load(), dur)
	}
	// Quiescent again (online, outbox empty, no call in flight): no more
	// goroutines than before the load, bar idle keep-alive HTTP connections
	// (idleConnGoroutine: how many the transports keep is theirs to choose;
	// counting them made this bound flaky). The few left over are goroutines
	// that end on their own timers (the outbox's idle workers, a wait's feed
	// closing). A leak per cycle or per event (hundreds of each here) would
	// pass this bound within seconds.
	if end.own > base.own+8 {
		t.Errorf("goroutines (bar idle HTTP connections) grew from %d to %d over the soak", base.own, end.own)
	}
	if long && end.heapKB > 3*base.heapKB+64<<10 {
		t.Errorf("live heap grew from %d kB to %d kB", base.heapKB, end.heapKB)
	}
}

// wantFromT3 lists the events each thread's runs and questions call for, read
// from the machine itself.
func wantFromT3(t *testing.T, h *harness, guess want) want {
	t.Helper()
	m := h.app.Fleet.Machines()[0]
	out := want{}
	for thread := range guess {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		p, err := m.Projection(ctx, thread)
		cancel()
		if err != nil {
			t.Fatalf("read thread %s: %v", thread, err)
		}
		for _, r := range p.Runs {
			switch r.Status {
			case "completed", "failed", "interrupted":
				out.add(thread, "thread."+r.Status)
			default:
				t.Errorf("thread %s run %s still %s after the soak", thread, r.ID, r.Status)
			}
		}
		for _, rr := range p.RuntimeRequests {
			if rr.Kind == "user_input" {
				out.add(thread, "thread.question")
			}
		}
	}
	return out
}

// stateKB is the state file's size (bbolt grows it in pages and never
// shrinks it: flat means the state stopped growing).
func stateKB(h *harness) int64 {
	fi, err := os.Stat(h.app.Store.Location())
	if err != nil {
		return -1
	}
	return fi.Size() >> 10
}

func trackedThreads(h *harness) int {
	ts, _ := h.app.Store.ListThreads()
	return len(ts)
}
