package app_test

// Fault injection against the whole connector: the fake T3's fault switches,
// a real webhook receiver, a real state file. Every test runs in watch mode
// (hook set) and checks the same thing at the end: every transition of every
// dispatched run reached the receiver exactly once per (thread, run, type) —
// a repeat is allowed only as a redelivery of the same webhook-id — and no
// goroutine outlived the test.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// leakCheck fails the test if it leaves goroutines behind. Call it first: its
// cleanup then runs after every other cleanup of the test.
func leakCheck(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt, goleak.IgnoreAnyFunction(fasthttpCleaner)) })
}

// ---- the receiver ----

type evKey struct{ Thread, Run, Type string }

// hookLog is a real webhook receiver on 127.0.0.1 that verifies every
// signature and counts deliveries per (thread, run, type) and per webhook-id.
type hookLog struct {
	srv           *httptest.Server
	token, secret string
	// status, when set, picks the answer to request n (1-based); 0 means 204.
	status func(n int, d delivery) int

	forget bool // keep no copy of deliveries (long runs)

	mu         sync.Mutex
	n          int
	badSig     int
	byKey      map[evKey]map[string]int // webhook-id → deliveries
	all        []delivery
	codes      []int // the answer to each of all
	failedReqs int
}

const (
	faultHookToken  = "hook-token-faults-5d2c"
	faultHookSecret = "whsec_" + "Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx5"
)

func newHookLog(t *testing.T, status func(n int, d delivery) int) *hookLog {
	t.Helper()
	return newHookLogWith(t, faultHookToken, faultHookSecret, status)
}

// newHookLogWith takes the credentials; a status of -1 answers 500 with a page
// that echoes the request's headers, as careless receivers do.
func newHookLogWith(t *testing.T, token, secret string, status func(n int, d delivery) int) *hookLog {
	t.Helper()
	hl := &hookLog{token: token, secret: secret, status: status, byKey: map[evKey]map[string]int{}}
	key, err := outbox.DecodeSecret(hl.secret)
	if err != nil {
		t.Fatal(err)
	}
	hl.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		d := delivery{header: r.Header.Clone(), body: b}
		_ = json.Unmarshal(b, &d.event)
		hl.mu.Lock()
		hl.n++
		n := hl.n
		if !hl.forget {
			hl.all = append(hl.all, d)
		}
		ts := r.Header.Get("webhook-timestamp")
		id := r.Header.Get("webhook-id")
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "." + string(b)))
		want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
		if r.Header.Get("webhook-signature") != want || r.Header.Get("Authorization") != "Bearer "+hl.token {
			hl.badSig++
		}
		code := 0
		if hl.status != nil {
			code = hl.status(n, d)
		}
		if code == 0 || code/100 == 2 {
			// accepted
			k := evKey{str(d.event, "thread_id"), str(d.event, "run_id"), str(d.event, "type")}
			if hl.byKey[k] == nil {
				hl.byKey[k] = map[string]int{}
			}
			hl.byKey[k][id]++
		} else {
			hl.failedReqs++
		}
		echo := code == -1
		switch code {
		case 0:
			code = http.StatusNoContent
		case -1:
			code = http.StatusInternalServerError
		}
		if !hl.forget {
			hl.codes = append(hl.codes, code)
		}
		hl.mu.Unlock()
		if echo {
			hb, _ := json.Marshal(r.Header)
			http.Error(w, "receiver broke; you sent: "+string(hb), code)
			return
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(hl.srv.Close)
	return hl
}

// settings points the connector at this receiver.
func (hl *hookLog) settings(s *appSettings) {
	s.HookURL, s.HookToken, s.HookSecret = hl.srv.URL, hl.token, hl.secret
}

// want maps a thread to the event types its runs must produce, in any order.
type want map[string][]string

func (w want) add(thread string, types ...string) { w[thread] = append(w[thread], types...) }

// arrived reports whether every wanted (thread, type) has been accepted.
func (hl *hookLog) arrived(w want) bool {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	have := map[[2]string]int{}
	for k := range hl.byKey {
		have[[2]string{k.Thread, k.Type}]++
	}
	for th, types := range w {
		for _, typ := range types {
			if have[[2]string{th, typ}] == 0 {
				return false
			}
		}
	}
	return true
}

func (hl *hookLog) summary() string {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	var lines []string
	for k, ids := range hl.byKey {
		lines = append(lines, fmt.Sprintf("%s %s %s: %v", k.Thread, k.Run, k.Type, ids))
	}
	sort.Strings(lines)
	return fmt.Sprintf("%d requests (%d failed on purpose, %d bad signatures)\n%s", hl.n, hl.failedReqs, hl.badSig, strings.Join(lines, "\n"))
}

// eventually polls cond until it holds or the safety net expires. The net is a minute at least,
// whatever limit a caller names: it only matters when the test is broken, and CI's fresh, slower
// machine runs every package's race-detector tests at once.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool, dump func() string) {
	t.Helper()
	limit = max(limit, time.Minute)
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			extra := ""
			if dump != nil {
				extra = "\n" + dump()
			}
			t.Fatalf("%s: not reached within the %v safety net%s", what, limit, extra)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle waits until every wanted event arrived and the outbox is empty (no
// redelivery can come after that), then checks: exactly one (thread, run,
// type) per wanted type, nothing else for these threads, one webhook-id per
// key, every signature valid, no dead letter. It returns the deliveries that
// repeated a webhook-id (allowed: at least once).
func (hl *hookLog) settle(t *testing.T, h *harness, w want) (repeats int) {
	t.Helper()
	return hl.settleStore(t, h.app.Store, h.logs, w)
}

func (hl *hookLog) settleStore(t *testing.T, st store.Store, logs *syncBuffer, w want) (repeats int) {
	t.Helper()
	dump := func() string { return hl.summary() + "\nlogs:\n" + tail(logs.String(), 60) }
	eventually(t, 60*time.Second, "all events delivered", func() bool {
		if !hl.arrived(w) {
			return false
		}
		p, d, _, err := st.Counts()
		return err == nil && p == 0 && d == 0
	}, dump)
	defer func() {
		if t.Failed() {
			t.Logf("%s", dump())
		}
	}()
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if hl.badSig > 0 {
		t.Errorf("%d deliveries with a bad signature or bearer", hl.badSig)
	}
	got := map[string][]string{}
	for k, ids := range hl.byKey {
		if _, ok := w[k.Thread]; !ok {
			t.Errorf("event for a thread nobody dispatched: %+v", k)
			continue
		}
		got[k.Thread] = append(got[k.Thread], k.Type)
		if len(ids) != 1 {
			t.Errorf("%+v arrived under %d webhook-ids %v: a duplicate transition", k, len(ids), ids)
		}
		for _, n := range ids {
			repeats += n - 1
		}
	}
	for th, types := range w {
		a, b := append([]string(nil), types...), got[th]
		sort.Strings(a)
		sort.Strings(b)
		if strings.Join(a, ",") != strings.Join(b, ",") {
			t.Errorf("thread %s: events %v, want %v", th, b, a)
		}
	}
	return repeats
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// ---- driving runs ----

// retry calls a tool until it succeeds: what an agent does while a machine
// is briefly unreachable. Every failure must still be a clear message; they
// are returned for the test to look at.
func (c *client) retry(name string, args map[string]any) (map[string]any, []string) {
	c.t.Helper()
	var errs []string
	for range 400 {
		sc, text, isErr := c.call(name, args)
		if !isErr {
			return sc, errs
		}
		errs = append(errs, text)
		time.Sleep(25 * time.Millisecond)
	}
	c.t.Fatalf("%s(%v) kept failing: %q", name, args, errs[len(errs)-1])
	return nil, errs
}

// Prompts that pick each scripted run of the fake.
const (
	promptDone     = "write the docs"
	promptFail     = "this will fail"
	promptQuestion = "ask a question first"
	promptHang     = "hang around"
)

// mix dispatches n runs of each script on machine, and says which events each
// must produce once questions are answered and hangs interrupted.
type mix struct {
	w         want
	questions []string
	hangs     []string
	threads   []string
}

func dispatchMix(c *client, machine string, n int, scripts ...string) *mix {
	c.t.Helper()
	if len(scripts) == 0 {
		scripts = []string{promptDone, promptFail, promptQuestion, promptHang}
	}
	m := &mix{w: want{}}
	for i := range n {
		for _, p := range scripts {
			d := c.ok("t3_dispatch", map[string]any{"machine": machine, "project": "api", "prompt": fmt.Sprintf("%s #%d", p, i)})
			tid := str(d, "thread_id")
			m.threads = append(m.threads, tid)
			switch p {
			case promptDone:
				m.w.add(tid, "thread.completed")
			case promptFail:
				m.w.add(tid, "thread.failed")
			case promptQuestion:
				m.w.add(tid, "thread.question", "thread.completed")
				m.questions = append(m.questions, tid)
			case promptHang:
				m.w.add(tid, "thread.interrupted")
				m.hangs = append(m.hangs, tid)
			}
		}
	}
	return m
}

// finish answers every question and interrupts every hang, retrying through
// outages; each waits until the thread is in the state that accepts it.
func (m *mix) finish(c *client) (toolErrors []string) {
	c.t.Helper()
	for _, tid := range m.questions {
		for range 400 {
			st, errs := c.retry("t3_thread", map[string]any{"thread_id": tid})
			toolErrors = append(toolErrors, errs...)
			if st["pending_question"] != nil {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
		_, errs := c.retry("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"scope": "Workspace", "checks": []any{"lint"}}})
		toolErrors = append(toolErrors, errs...)
	}
	for _, tid := range m.hangs {
		_, errs := c.retry("t3_interrupt", map[string]any{"thread_id": tid})
		toolErrors = append(toolErrors, errs...)
	}
	return toolErrors
}

// clearErrors checks tool errors seen during an outage: each names the
// machine or the thread, and none is an internal error.
func clearErrors(t *testing.T, errs []string) {
	t.Helper()
	for _, e := range errs {
		if e == "" || strings.Contains(e, "internal error") || !(strings.Contains(e, `"mac"`) || strings.Contains(e, "thread")) {
			t.Errorf("unclear tool error during the fault: %q", e)
		}
	}
}

// faultCount collects the figures docs/reliability.md quotes.
func faultCount(t *testing.T, fault string, injected, runs, events, repeats int) {
	t.Logf("FAULTS %s: injected %d, runs %d, events %d, redeliveries %d", fault, injected, runs, events, repeats)
}

func countEvents(w want) int {
	n := 0
	for _, ts := range w {
		n += len(ts)
	}
	return n
}

// ---- the faults ----

// T3 restarts between steps of the runs, keeping its database: the watcher
// resumes from its cursor and the replay brings the missed transitions.
func TestFaultRestartSameDatabase(t *testing.T) { faultRestart(t, false) }

// T3 restarts with a replaced database (the sequence goes back): the watcher
// gets a snapshot and the detector reads how the runs it missed ended.
func TestFaultRestartReplacedDatabase(t *testing.T) { faultRestart(t, true) }

func faultRestart(t *testing.T, replaced bool) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	var snapshots atomic.Int64
	fk.OnItemSent(func(kind string, _ int64, _ time.Time) {
		if kind == "shell:snapshot" {
			snapshots.Add(1)
		}
	})
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, settings: hl.settings})
	h.waitOnline("mac")
	c := h.client("faults")
	m := dispatchMix(c, "mac", 2)
	restarts, lowered := 0, 0
	restart := func() {
		before := fk.Stats().WSConnections
		head := fk.Head()
		if cursor := h.app.Fleet.Machines()[0].Watcher().Status().Cursor; replaced && cursor > 0 {
			// Below the connector's cursor too: a database that is behind what it saw.
			head = min(head, cursor) / 2
			lowered++
		}
		fk.Restart(head)
		restarts++
		// Resynchronized on a new socket: the cursor is at T3's head again (after a
		// replaced database it first goes down to the snapshot's sequence).
		// A safety net, not a speed check: reconnects back off with jitter, and
		// under the race detector on a loaded machine a resync took over 20 s.
		eventually(t, 90*time.Second, "resync after restart", func() bool {
			st := h.app.Fleet.Machines()[0].Watcher().Status()
			return fk.Stats().WSConnections > before && st.Online && st.Cursor == fk.Head()
		}, nil)
	}
	step := func() {
		for i := 0; fk.Step(); i++ {
			if i%3 == 0 {
				restart()
			}
		}
	}
	step()
	errs := m.finish(c)
	step()
	restart()
	clearErrors(t, errs)
	repeats := hl.settle(t, h, m.w)
	// The path taken: replays from the cursor, or a snapshot after every restart.
	name := "restart-same-db"
	if replaced {
		name = "restart-replaced-db"
		if n := snapshots.Load(); n < int64(lowered)+1 || lowered < restarts/2 {
			t.Errorf("%d shell snapshots for %d restarts with a replaced database (of %d)", n, lowered, restarts)
		}
	} else if n := snapshots.Load(); n != 1 {
		t.Errorf("%d shell snapshots: restarts with the same database must resume by replay", n)
	}
	faultCount(t, name, restarts, len(m.threads), countEvents(m.w), repeats)
}

// The socket is dropped every 200 ms while runs progress by themselves.
func TestFaultSocketDroppedEvery200ms(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: 150 * time.Millisecond})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, settings: hl.settings})
	h.waitOnline("mac")
	c := h.client("faults")
	m := dispatchMix(c, "mac", 2)

	var drops atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(200 * time.Millisecond)
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
	errs := m.finish(c)
	// Keep dropping until every run has ended on T3's side.
	eventually(t, 60*time.Second, "runs settled on T3", func() bool {
		for _, tid := range m.threads {
			if st, _ := fk.ThreadStatus(tid); st != "completed" && st != "failed" && st != "interrupted" {
				return false
			}
		}
		return drops.Load() >= 10
	}, nil)
	close(stop)
	<-done
	clearErrors(t, errs)
	repeats := hl.settle(t, h, m.w)
	faultCount(t, "socket-drop-200ms", int(drops.Load()), len(m.threads), countEvents(m.w), repeats)
}

// T3 refuses WebSocket tickets for a while: the machine shows offline with
// the reason, tools say so, and once tickets flow again nothing is missing.
func TestFaultTicketsRefusedThenAllowed(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: 20 * time.Millisecond})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, settings: hl.settings})
	h.waitOnline("mac")
	c := h.client("faults")
	m := dispatchMix(c, "mac", 2, promptDone, promptFail)

	const route = "POST /api/auth/websocket-ticket"
	before := fk.Stats().HTTPRequests[route]
	fk.RefuseTickets(true)
	fk.DropConnections()
	eventually(t, 30*time.Second, "three refused tickets", func() bool { return fk.Stats().HTTPRequests[route]-before >= 3 }, nil)
	refused := int(fk.Stats().HTTPRequests[route] - before)
	ms := c.ok("t3_machines", nil)["machines"].([]any)[0].(map[string]any)
	if ms["online"] != false || !strings.Contains(str(ms, "problem"), "websocket ticket") {
		t.Fatalf("machine while tickets are refused: %v", ms)
	}
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x"}, `"mac"`, "websocket ticket")
	// The runs end on T3 while the connector cannot see it.
	eventually(t, 30*time.Second, "runs settled on T3", func() bool {
		for _, tid := range m.threads {
			if st, _ := fk.ThreadStatus(tid); st != "completed" && st != "failed" {
				return false
			}
		}
		return true
	}, nil)
	fk.RefuseTickets(false)
	repeats := hl.settle(t, h, m.w)
	faultCount(t, "tickets-refused", refused, len(m.threads), countEvents(m.w), repeats)
}

// twoMachines runs the connector against mac (the faulty one) and pc.
func twoMachines(t *testing.T, hl *hookLog, fo t3fake.Options, settings func(*appSettings)) (*harness, *t3fake.Server, *t3fake.Server) {
	t.Helper()
	fo.Label = "mac-env"
	mac := t3fake.StartT(t, fo)
	mac.AddProject("api", "/srv/api")
	fo.Label = "pc-env"
	pc := t3fake.StartT(t, fo)
	pc.AddProject("api", "/srv/pc-api")
	t.Setenv("T3CODE_MCP_TEST_PC_TOKEN", pc.Token())
	extra := fmt.Sprintf("[machines.pc]\nurl = %q\ntoken_env = \"T3CODE_MCP_TEST_PC_TOKEN\"\nprojects = [\"api\"]\n", pc.URL())
	h := newHarness(t, harnessOpts{fake: mac, extraTOML: extra, settings: func(s *appSettings) {
		hl.settings(s)
		if settings != nil {
			settings(s)
		}
	}})
	h.waitOnline("mac")
	h.waitOnline("pc")
	return h, mac, pc
}

// One machine answers every read with 500 while another works: tools on the
// good one are unaffected, tools on the bad one say what T3 answered, and
// both machines' events arrive (the bad one's once the enrichment window
// passes, marked partial: which fields are missing and why; a plain completion
// needs no read and arrives whole).
func TestFaultMachineAnswering500(t *testing.T) {
	leakCheck(t)
	hl := newHookLog(t, nil)
	h, mac, pc := twoMachines(t, hl, t3fake.Options{ManualSteps: true}, func(s *appSettings) {
		s.HookEnrichTimeout = 2 * time.Second
		s.ThreadFeeds = 0 // every t3_thread reads (a thread's subscription could answer it)
	})
	c := h.client("faults")
	mm := dispatchMix(c, "mac", 1, promptDone, promptFail)
	pm := dispatchMix(c, "pc", 1, promptDone, promptFail)
	mac.HTTPFail(500)
	failed := 0
	for _, tid := range mm.threads {
		c.fails("t3_thread", map[string]any{"thread_id": tid}, `machine "mac"`, "internal error")
		failed++
	}
	for _, tid := range pm.threads {
		if th := c.ok("t3_thread", map[string]any{"thread_id": tid}); th["machine"] != "pc" {
			t.Fatalf("pc thread = %v", th)
		}
	}
	c.ok("t3_projects", map[string]any{"machine": "mac"}) // from the watcher: no read needed
	mac.StepAll()
	pc.StepAll()
	for _, tid := range pm.threads {
		if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "completed" && w["reason"] != "failed" {
			t.Fatalf("wait on pc = %v", w)
		}
	}
	w := want{}
	for k, v := range mm.w {
		w[k] = v
	}
	for k, v := range pm.w {
		w[k] = v
	}
	repeats := hl.settle(t, h, w)
	mac.HTTPFail(0)
	for _, tid := range mm.threads {
		c.ok("t3_thread", map[string]any{"thread_id": tid})
	}
	hl.mu.Lock()
	for _, d := range hl.all {
		ev := d.event
		// A plain completion is whole from its shell row: no read, so never partial.
		completed := ev["type"] == "thread.completed"
		partial := ev["machine"] == "mac" && !completed
		if completed && !strings.HasPrefix(str(ev, "summary"), "Done: ") {
			t.Errorf("completion without its summary: %v", ev)
		}
		if (ev["partial"] == true) != partial {
			t.Errorf("event %v: partial %v, want %v", ev["id"], ev["partial"], partial)
		}
		if partial && (ev["missing"] == nil || !strings.Contains(str(ev, "partial_reason"), "internal error")) {
			t.Errorf("partial event without what is missing and why: %v", ev)
		}
	}
	hl.mu.Unlock()
	faultCount(t, "http-500", failed, len(mm.threads)+len(pm.threads), countEvents(w), repeats)
}

// A machine hangs on every read: tools on the other machine answer while a
// call to the hung one is still blocked, the hung one's call times out with
// a message that says so, and both machines' events arrive (the other's while
// the hang lasts).
func TestFaultMachineHangingOnHTTP(t *testing.T) {
	leakCheck(t)
	hl := newHookLog(t, nil)
	h, mac, pc := twoMachines(t, hl, t3fake.Options{ManualSteps: true}, func(s *appSettings) {
		s.Limits.CallTimeout = 6 * time.Second
		s.HTTPTimeout = 30 * time.Second
		s.ThreadFeeds = 0 // every t3_thread reads (a thread's subscription could answer it)
	})
	c := h.client("faults")
	mm := dispatchMix(c, "mac", 1, promptDone, promptFail)
	pm := dispatchMix(c, "pc", 1, promptDone, promptFail)

	// t3_thread reads the bounded route (the full one on older builds).
	reads := func() int64 {
		st := mac.Stats().HTTPRequests
		return st["GET /api/orchestration/threads/{id}"] + st["GET /api/orchestration/threads/{id}/bounded"]
	}
	before := reads()
	mac.HTTPHang(true)
	type outcome struct {
		text  string
		isErr bool
		err   error
	}
	hung := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := c.session.CallTool(ctx, &mcp.CallToolParams{Name: "t3_thread", Arguments: map[string]any{"thread_id": mm.threads[0]}})
		o := outcome{err: err}
		if err == nil {
			o.isErr, o.text = res.IsError, resultText(res)
		}
		hung <- o
	}()
	eventually(t, 10*time.Second, "the read reached the hung machine", func() bool { return reads() > before }, nil)

	// The other machine is fully usable meanwhile.
	c.ok("t3_machines", nil)
	c.ok("t3_projects", map[string]any{"machine": "pc"})
	for _, tid := range pm.threads {
		c.ok("t3_thread", map[string]any{"thread_id": tid})
	}
	pc.StepAll()
	for _, tid := range pm.threads {
		c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
	}
	extra := dispatchMix(c, "pc", 1, promptDone)
	pc.StepAll()
	for k, v := range extra.w {
		pm.w[k] = v
	}
	eventually(t, 30*time.Second, "pc events during the hang", func() bool { return hl.arrived(pm.w) }, hl.summary)
	select {
	case o := <-hung:
		t.Fatalf("the call to the hung machine ended before the other machine's work: %+v", o)
	default:
	}
	o := <-hung
	if o.err != nil || !o.isErr || !strings.Contains(o.text, "t3_thread timed out after 6s") {
		t.Fatalf("call to the hung machine: %+v, want a timeout error", o)
	}
	// Runs on the hung machine end; their events wait for the reads, then go.
	mac.StepAll()
	mac.HTTPHang(false)
	w := want{}
	for k, v := range mm.w {
		w[k] = v
	}
	for k, v := range pm.w {
		w[k] = v
	}
	repeats := hl.settle(t, h, w)
	c.ok("t3_thread", map[string]any{"thread_id": mm.threads[0]})
	faultCount(t, "http-hang", 1, len(mm.threads)+len(pm.threads)+len(extra.threads), countEvents(w), repeats)
}

// T3 stops answering: streams stall and Pongs stop. The keepalive declares
// the socket dead, the watcher reconnects, and when T3 answers again every
// transition of the stall arrives.
func TestFaultT3StopsAnswering(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, settings: hl.settings})
	h.waitOnline("mac")
	c := h.client("faults")
	m := dispatchMix(c, "mac", 1, promptDone, promptFail)
	before := fk.Stats().WSConnections
	fk.StallStreams(true)
	fk.StopPongs(true)
	fk.StepAll()
	eventually(t, 30*time.Second, "dead socket replaced", func() bool { return fk.Stats().WSConnections > before }, func() string { return tail(h.logs.String(), 40) })
	if !strings.Contains(h.logs.String(), "no Pong") {
		t.Errorf("the reconnect does not say why (no Pong): %s", tail(h.logs.String(), 40))
	}
	fk.StopPongs(false)
	fk.StallStreams(false)
	repeats := hl.settle(t, h, m.w)
	faultCount(t, "t3-stops-answering", 1, len(m.threads), countEvents(m.w), repeats)
}

// fill writes a file until the file system is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for range 1 << 16 {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return p
			}
			t.Fatal(err)
		}
	}
	t.Fatal("the file system never filled up")
	return ""
}

// The state file's disk fills up: writes fail with a clear error, reads keep
// working, the watcher holds the stream instead of losing transitions, and
// when space returns everything is delivered; the file is not corrupted.
func TestFaultStoreDiskFull(t *testing.T) {
	leakCheck(t)
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill up (needs root and mount rights): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, stateDir: dir, settings: hl.settings})
	h.waitOnline("mac")
	c := h.client("faults")
	m := dispatchMix(c, "mac", 1, promptDone, promptFail)

	filler := fill(t, dir)
	failure := ""
	for i := 0; i < 50 && failure == ""; i++ {
		sc, text, isErr := c.call("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": fmt.Sprintf("%s while full #%d", promptDone, i)})
		if isErr {
			failure = text
			continue
		}
		// Some commits still fit in pages the file already owns.
		m.w.add(str(sc, "thread_id"), "thread.completed")
		m.threads = append(m.threads, str(sc, "thread_id"))
	}
	if failure == "" {
		t.Fatal("no dispatch failed with the state file's disk full")
	}
	if !strings.Contains(failure, "state file") || !strings.Contains(failure, "no space left on device") {
		t.Fatalf("disk-full error %q does not say what is wrong", failure)
	}
	// Reads still work; the runs end on T3 while the detector cannot record.
	c.ok("t3_machines", nil)
	for _, tid := range m.threads {
		c.ok("t3_thread", map[string]any{"thread_id": tid})
	}
	fk.StepAll()
	// The detector's commit may still fit in pages the file owns, or fail (the watcher then
	// holds the stream); the outbox may fail to record a delivery (it pauses and sends the
	// same webhook-id again). With group commit the few writes left may also all fit in the
	// pages the file already owns, and every event is delivered while the disk is full. Either
	// way nothing may be lost.
	failed := func() bool {
		l := h.logs.String()
		return strings.Contains(l, "could not record thread changes") || strings.Contains(l, "outbox: recording the attempt")
	}
	eventually(t, 10*time.Second, "a store write failing, or every event delivered, after the runs ended", func() bool {
		return failed() || hl.arrived(m.w)
	}, func() string { return tail(h.logs.String(), 40) })
	if !failed() {
		t.Logf("every store write after the runs ended fitted in the pages the file owns")
	}

	// Space returns: nothing was lost.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone + " after"}), "thread_id")
	m.w.add(tid, "thread.completed")
	m.threads = append(m.threads, tid)
	fk.StepAll()
	repeats := hl.settle(t, h, m.w)
	if repeats > 20 {
		t.Errorf("%d redeliveries: the outbox resends in a loop when it cannot record a delivery", repeats)
	}
	h.stop()

	db, err := bolt.Open(filepath.Join(dir, store.FileName), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			t.Errorf("state file corrupt: %v", err)
		}
		return nil
	})
	db.Close()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, tid := range m.threads {
		if _, ok, err := st.GetThread(tid); !ok || err != nil {
			t.Errorf("thread %s lost from the state file: %v", tid, err)
		}
	}
	faultCount(t, "disk-full", 1, len(m.threads), countEvents(m.w), repeats)
}

// The wall clock jumps back and forth while events wait for retries: every
// event is still delivered, in order per thread, none becomes a dead letter.
func TestFaultOutboxClockJumps(t *testing.T) {
	leakCheck(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	// Before each jump the receiver fails, so retries are scheduled on the old clock.
	var failing atomic.Bool
	hl := newHookLog(t, func(int, delivery) int {
		if failing.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	logs := &syncBuffer{}
	ob, err := outbox.New(st, outbox.Config{
		URL: hl.srv.URL, Token: hl.token, Secret: hl.secret, Clock: clock,
		Backoff: outbox.ExponentialBackoff{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
		Logger:  slogText(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ob.Run(ctx) }()
	defer func() { cancel(); <-done }()

	jumps := []time.Duration{2 * time.Hour, -3 * time.Hour, 6 * time.Hour, -20 * time.Hour, 90 * time.Second, -90 * time.Second, -time.Hour, 5 * time.Hour}
	w := want{}
	order := map[string][]string{} // stream → event ids in commit order
	seq := 0
	for _, j := range jumps {
		var evs []store.Event
		for s := range 3 {
			seq++
			thread := fmt.Sprintf("thread-%d", s)
			run := fmt.Sprintf("run-%d", seq)
			id := fmt.Sprintf("evt_%04d", seq)
			body, _ := json.Marshal(map[string]any{"id": id, "type": "thread.completed", "thread_id": thread, "run_id": run})
			evs = append(evs, store.Event{ID: id, Stream: "mac/" + thread, Body: body, CreatedAt: clock()})
			w.add(thread, "thread.completed")
			order["mac/"+thread] = append(order["mac/"+thread], id)
		}
		failed := hlFailed(hl)
		failing.Store(true)
		if err := st.Commit(store.Batch{Events: evs}); err != nil {
			t.Fatal(err)
		}
		ob.Notify()
		eventually(t, 10*time.Second, "a failed attempt before the jump", func() bool { return hlFailed(hl) >= failed+3 }, func() string { return hl.summary() + "\n" + tail(logs.String(), 30) })
		offset.Add(int64(j))
		failing.Store(false)
		ob.Notify()
	}
	repeats := hl.settleStore(t, st, logs, w)
	// Per-thread order: the first accepted delivery of each id, in arrival order.
	hl.mu.Lock()
	seen := map[string]bool{}
	got := map[string][]string{}
	for i, d := range hl.all {
		id := d.header.Get("webhook-id")
		if hl.codes[i] != http.StatusNoContent || seen[id] {
			continue
		}
		seen[id] = true
		s := "mac/" + str(d.event, "thread_id")
		got[s] = append(got[s], id)
	}
	hl.mu.Unlock()
	for s, ids := range order {
		if strings.Join(got[s], ",") != strings.Join(ids, ",") {
			t.Errorf("stream %s delivered %v, want %v", s, got[s], ids)
		}
	}
	faultCount(t, "clock-jumps", len(jumps), seq, seq, repeats)
}

func hlFailed(hl *hookLog) int {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	return hl.failedReqs
}

func resultText(res *mcp.CallToolResult) string {
	text := ""
	for _, ct := range res.Content {
		if tc, ok := ct.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	return text
}

func slogText(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Two runs of one thread start and end while the connector cannot see the
// thread (its stream stalled; in real T3 also a queued follow-up message, or
// a snapshot after a reconnect): when the stream resumes, one batch holds the
// thread's last state only. The run in between must still get its event.
func TestFaultRunsBetweenObservations(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, settings: hl.settings})
	h.waitOnline("mac")
	c := h.client("faults")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone}), "thread_id")
	fk.StepAll()
	w := want{}
	w.add(tid, "thread.completed")
	hl.settle(t, h, w)

	fk.StallStreams(true)
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": promptFail})
	fk.StepAll()
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": promptDone + " again"})
	fk.StepAll()
	fk.StallStreams(false)
	w.add(tid, "thread.failed", "thread.completed")
	repeats := hl.settle(t, h, w)
	faultCount(t, "runs-between-observations", 1, 3, countEvents(w), repeats)
}
