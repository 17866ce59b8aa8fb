package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// A machine is one fake T3 server in the harness process, plus the driver state that moves its
// runs (one driver goroutine moves every machine's: driver below).
//
// Every fake runs with ManualSteps: nothing moves unless the driver goroutine calls Step. The fake steps runs in FIFO order (a run that takes a step goes to the back of the queue,
// a run that parks leaves it, run.interrupt puts a parked run back), and the driver is the only
// goroutine that starts, interrupts or steps runs, so it keeps an exact mirror of that queue: it
// knows which run each Step moved, and right after a run's settling step the fake's head is the
// sequence of the shell row that says so. The OnItemSent hook records when the frame holding
// each shell row left for the connector; the two together give the send time of the frame that
// settled each run, which is where every latency below starts.

// role says what a thread is used for during the run.
type role int

const (
	rolePipeline role = iota // rate-driven scripted runs (events)
	roleWait                 // one long run awaited by a t3_wait call
	rolePush                 // comparison: one long run, noticed through the connector
	rolePoll                 // comparison: one long run, noticed by an HTTP poller
)

// Step counts of the fake's scripts (see t3fake.Scripts): how many Steps a run takes from
// StartRun until it settles (scripted) or parks (hang), and one more after run.interrupt.
var scriptSteps = map[string]int{"default": 7, "fail": 2}

const hangSteps = 2

// Prompts that pick each script; checked against t3fake.ScriptFor in newMachine.
var scriptPrompts = map[string]string{
	"default": Prompt,
	"fail":    "Please fail: " + Prompt,
	"hang":    "Hang on: " + Prompt,
}

// run is one run the harness started. Fields after the first block are written by the driver
// (until settled is closed) and read by others after.
type run struct {
	m      *machine
	thread string
	id     string
	role   role

	stepsLeft int
	settles   bool // the last step of stepsLeft settles the run (false: it parks)
	parked    bool
	release   time.Time // hang runs: when to interrupt

	stagedAt  time.Time // when the run was started (its "dispatch" time)
	settleSeq int64
	// settleFrom is the fake's head before the settling Step: the step's own items (its shell row
	// at settleSeq, its thread-stream events) carry the sequences after it, up to settleSeq.
	settleFrom int64
	settleAt   time.Time     // when the settling Step returned
	settled    chan struct{} // closed once settleSeq and settleAt are set
	parkedCh   chan struct{} // hang runs: closed when parked
}

type sentItem struct {
	seq int64
	at  time.Time
}

type machine struct {
	idx   int
	name  string
	fk    *t3fake.Server
	pid   string
	token string
	gzip  bool // the harness's own reads ask for gzip (Config.Compression "gzip")

	threads []string // ids, creation order

	mu   sync.Mutex
	sent []sentItem // shell:thread.updated items as their frames left, in send order
	// threadSent: thread-stream events ("thread:<event type>", sequenced) as their frames left,
	// in send order — a wait can be woken by its thread's own subscription before the shell row.
	threadSent []sentItem
	// maxSent is the highest sequence the connector has been sent.
	maxSent atomic.Int64

	client *t3.Client
	connMu sync.Mutex
	conn   *effectrpc.Conn

	drv  *driver       // the driver of every machine (newDriver)
	done chan struct{} // closed when the driver stops driving this machine
	err  atomic.Pointer[error]

	// Driver state: only the driver goroutine touches these.
	queue    []*run
	releases []*run // parked or parking hang runs with a release time, in no particular order
	pipe     pipeline
	onSettle func(*run)
	driving  bool // a driver was made for it (done will close)
}

// pipeline starts scripted runs at a rate on a ring of threads.
type pipeline struct {
	rate    float64 // runs per second; 0 stops starting new runs
	start   time.Time
	started int
	script  string
	threads []string
	limit   int // only the first limit threads take runs; 0: all
	next    int
	busy    map[string]bool
	maxLag  int64 // start nothing while the connector is this many sequences behind the head
	skipped int   // runs not started: every pipeline thread busy
	dropped int   // runs not started: the connector lagged by more than maxLag
	behind  int   // runs not started: the driver itself fell behind (the fake's CPU)
}

// due is how many runs the pipeline owes at now: its rate's runs since its start, less those
// started (or counted as not started).
func (p *pipeline) due(now time.Time) int {
	return int(now.Sub(p.start).Seconds()*p.rate) - p.started
}

// newMachine starts a fake machine; compression is Config.Compression, which the harness's own
// reads of it follow.
func newMachine(idx int, name string, opts t3fake.Options, compression string) (*machine, error) {
	for script, p := range scriptPrompts {
		if got := t3fake.ScriptFor(p); got != script {
			return nil, fmt.Errorf("loadtest: prompt for %s picks the fake's %s script", script, got)
		}
	}
	opts.Label = name
	opts.ManualSteps = true
	fk, err := t3fake.New(opts)
	if err != nil {
		return nil, err
	}
	m := &machine{idx: idx, name: name, fk: fk, token: fk.Token(), gzip: compression == "gzip", done: make(chan struct{})}
	m.pipe.busy = map[string]bool{}
	m.pid = fk.AddProject("load", fmt.Sprintf("/srv/load/%s", name))
	fk.OnItemSent(m.itemSent)
	c, err := t3.NewClient(name, fk.URL(), fk.Token(), t3.Options{Timeout: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Compression: compression})
	if err != nil {
		fk.Close()
		return nil, err
	}
	m.client = c
	return m, nil
}

func (m *machine) itemSent(kind string, seq int64, at time.Time) {
	if kind == "shell:thread.updated" {
		m.mu.Lock()
		m.sent = append(m.sent, sentItem{seq, at})
		m.mu.Unlock()
	} else if seq > 0 && strings.HasPrefix(kind, "thread:") && kind != "thread:snapshot" {
		m.mu.Lock()
		m.threadSent = append(m.threadSent, sentItem{seq, at})
		m.mu.Unlock()
	}
	if kind == "shell:thread.updated" || kind == "shell:snapshot" {
		for {
			cur := m.maxSent.Load()
			if seq <= cur || m.maxSent.CompareAndSwap(cur, seq) {
				break
			}
		}
	}
}

// rpc is the harness's own socket to the fake, for commands (thread.create, run.interrupt).
func (m *machine) rpc(ctx context.Context) (*effectrpc.Conn, error) {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	if m.conn != nil {
		select {
		case <-m.conn.Done():
			m.conn = nil
		default:
			return m.conn, nil
		}
	}
	conn, err := m.client.DialRPC(ctx)
	if err != nil {
		return nil, err
	}
	m.conn = conn
	return conn, nil
}

// seed creates n threads with ids of the connector's own form (thread-<uuid>): ids are unique
// across machines, as T3's are. They are added to the fake directly (t3fake.AddThreadWithID, the
// same records and stream items thread.create makes), which seeds 100,000 threads in seconds
// instead of a minute of socket round trips.
func (m *machine) seed(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		if i%1000 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		id := t3.NewID("thread")
		if err := m.fk.AddThreadWithID(m.pid, id, fmt.Sprintf("Load thread %d on %s", i, m.name)); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		m.threads = append(m.threads, id)
	}
	return nil
}

// finishRuns gives every thread runs finished default-script runs, so that its shell row and
// projection look like those of a thread that has been used (latest run, timestamps, last
// visible message). It runs before the connector connects.
func (m *machine) finishRuns(runs int) error {
	for i := 0; i < runs; i++ {
		for _, tid := range m.threads {
			if _, err := m.fk.StartRun(tid, Prompt); err != nil {
				return err
			}
		}
		m.fk.StepAll()
	}
	return nil
}

// bigThread gives the machine's thread tid runs default-script runs (five turn items each).
func (m *machine) bigThread(tid string, runs int) error {
	for i := 0; i < runs; i++ {
		if _, err := m.fk.StartRun(tid, fmt.Sprintf("%s (attempt %d)", Prompt, i+1)); err != nil {
			return err
		}
		m.fk.StepAll()
	}
	return nil
}

// getThread reads GET /api/orchestration/threads/{id} and returns the body's size: the fake's
// side of a thread read, without any decoding.
func (m *machine) getThread(ctx context.Context, tid string) (int, error) {
	return m.get(ctx, "/api/orchestration/threads/"+tid)
}

// get reads one of the fake's orchestration routes and returns the body's size.
func (m *machine) get(ctx context.Context, path string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.fk.URL()+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+m.token)
	req.Header.Set("x-t3-orchestration-protocol", "2")
	if !m.gzip {
		// Go's transport would ask for gzip, which the fake then spends CPU on: ask for what
		// the connector asks a loopback machine for unless told to gzip (Config.Compression).
		req.Header.Set("Accept-Encoding", "identity")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	n, err := io.Copy(io.Discard, res.Body)
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, res.Status)
	}
	return int(n), err
}

// ---- the driver ----

const tick = 5 * time.Millisecond

// driver moves the runs of every machine from one goroutine on one ticker: 100 machines with a
// goroutine and a 5 ms ticker each woke the harness 20,000 times a second, and the scheduling
// and timers of those wake-ups were a tenth of its CPU under load (docs/benchmarks.md, "The
// harness's cost, evening"). Each tick steps every machine's queued runs (tickAll: a share of
// the machines per core, in turn within a share); commands
// (driver.do, machine.do) run between ticks, one command for as many machines as it names: a
// command per machine would wait a tick each, 100 ticks for something every machine does. A
// machine whose tick fails stops being driven (its done closes, its error is kept) while the
// others go on, as when each had its own goroutine.
type driver struct {
	machines []*machine
	cmds     chan *driverCmd
	stopped  chan struct{} // closed when run returns, after every machine's done
}

// driverCmd is a function to run on the driver goroutine for each of some machines' state.
type driverCmd struct {
	ms  []*machine
	f   func(m *machine)
	err error         // a machine of ms was no longer driven: f did not run
	ran chan struct{} // closed when f has run (or err is set)
}

// newDriver makes the driver of machines and points their commands at it.
func newDriver(machines []*machine) *driver {
	d := &driver{machines: machines, cmds: make(chan *driverCmd, 64), stopped: make(chan struct{})}
	for _, m := range machines {
		m.drv, m.driving = d, true
	}
	return d
}

// run drives every machine until ctx ends; every machine's done is closed when it returns.
func (d *driver) run(ctx context.Context) {
	live := append([]*machine(nil), d.machines...)
	defer func() {
		for _, m := range live {
			close(m.done)
		}
		close(d.stopped)
	}()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-d.cmds:
			c.run(live)
		case now := <-t.C:
			failed := tickAll(ctx, live, now)
			keep := live[:0]
			for i, m := range live {
				if err := failed[i]; err != nil {
					m.err.Store(&err)
					close(m.done)
					continue
				}
				keep = append(keep, m)
			}
			clear(live[len(keep):])
			live = keep
		}
	}
}

// tickAll ticks every machine of live, in as many goroutines as Go runs at once (GOMAXPROCS),
// each a contiguous share of the machines: the fakes' work per tick is the harness's largest,
// and one goroutine would leave it one core however many the machine has. It returns each
// machine's error.
func tickAll(ctx context.Context, live []*machine, now time.Time) []error {
	errs := make([]error, len(live))
	shares := min(runtime.GOMAXPROCS(0), len(live))
	if shares <= 1 {
		for i, m := range live {
			errs[i] = m.tick(ctx, now)
		}
		return errs
	}
	var wg sync.WaitGroup
	per := (len(live) + shares - 1) / shares
	for lo := 0; lo < len(live); lo += per {
		hi := min(lo+per, len(live))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				errs[i] = live[i].tick(ctx, now)
			}
		})
	}
	wg.Wait()
	return errs
}

// run runs c for each of its machines, or for none if one of them is no longer driven.
func (c *driverCmd) run(live []*machine) {
	defer close(c.ran)
	for _, m := range c.ms {
		if !slices.Contains(live, m) {
			c.err = m.failure()
			return
		}
	}
	for _, m := range c.ms {
		c.f(m)
	}
}

// do runs f for each of ms on the driver goroutine, in one turn of it, and waits. It fails,
// without running f, if one of ms is no longer driven (its tick failed, or the driver stopped).
func (d *driver) do(ctx context.Context, ms []*machine, f func(m *machine)) error {
	c := &driverCmd{ms: ms, f: f, ran: make(chan struct{})}
	select {
	case d.cmds <- c:
	case <-d.stopped:
		return ms[0].failure()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-c.ran:
		return c.err
	case <-d.stopped:
		return ms[0].failure()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// do runs f on the driver goroutine and waits for it.
func (m *machine) do(ctx context.Context, f func()) error {
	return m.drv.do(ctx, []*machine{m}, func(*machine) { f() })
}

func (m *machine) failure() error {
	if e := m.err.Load(); e != nil {
		return *e
	}
	return fmt.Errorf("%s: driver stopped", m.name)
}

// startHang starts a hang run on each thread (driver goroutine): it parks after hangSteps steps
// and settles (interrupted) one step after its release time.
func (m *machine) startHang(threads []string, rl role, release func(i int) time.Time) ([]*run, error) {
	out := make([]*run, 0, len(threads))
	for i, tid := range threads {
		id, err := m.fk.StartRun(tid, scriptPrompts["hang"])
		if err != nil {
			return out, err
		}
		r := &run{m: m, thread: tid, id: id, role: rl, stepsLeft: hangSteps, release: release(i), stagedAt: time.Now(),
			settled: make(chan struct{}), parkedCh: make(chan struct{})}
		m.queue = append(m.queue, r)
		m.releases = append(m.releases, r)
		out = append(out, r)
	}
	return out, nil
}

func (m *machine) tick(ctx context.Context, now time.Time) error {
	// Releases: interrupt parked runs that are due.
	keep := m.releases[:0]
	for _, r := range m.releases {
		if !r.parked || now.Before(r.release) {
			keep = append(keep, r)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := t3.Dispatch(cctx, m.rpc, t3.RunInterrupt(r.thread, r.id, "load test release"))
		cancel()
		if err != nil {
			return fmt.Errorf("%s: interrupt %s: %w", m.name, r.id, err)
		}
		r.parked, r.stepsLeft, r.settles = false, 1, true
		m.queue = append(m.queue, r)
	}
	clear(m.releases[len(keep):])
	m.releases = keep

	// The pipeline: start what the rate asks for, unless the connector lags.
	p := &m.pipe
	if p.rate > 0 {
		due := p.due(now)
		// A driver that fell behind (its fake could not keep up) does not burst to catch up:
		// more than ten ticks' worth is counted, not started.
		if burst := max(1, int(p.rate*10*tick.Seconds())); due > burst {
			p.behind += due - burst
			p.started += due - burst
			due = burst
		}
		if due > 0 && p.maxLag > 0 && m.fk.Head()-m.maxSent.Load() > p.maxLag {
			p.dropped += due
			p.started += due // offered load that was not started is not made up later
			due = 0
		}
		for ; due > 0; due-- {
			p.started++
			tid := m.nextIdle()
			if tid == "" {
				p.skipped++
				continue
			}
			id, err := m.fk.StartRun(tid, scriptPrompts[p.script])
			if err != nil {
				return fmt.Errorf("%s: start run: %w", m.name, err)
			}
			p.busy[tid] = true
			m.queue = append(m.queue, &run{m: m, thread: tid, id: id, role: rolePipeline, stepsLeft: scriptSteps[p.script],
				settles: true, stagedAt: now, settled: make(chan struct{})})
		}
	}

	// One step for every queued run.
	n := len(m.queue)
	if pend := m.fk.Pending(); pend != n {
		return fmt.Errorf("%s: driver lost track of the fake's queue (%d queued, mirror has %d)", m.name, pend, n)
	}
	for i := 0; i < n; i++ {
		from := m.fk.Head()
		if !m.fk.Step() {
			return fmt.Errorf("%s: Step found nothing to do", m.name)
		}
		r := m.queue[0]
		m.queue[0] = nil
		m.queue = m.queue[1:]
		r.stepsLeft--
		if r.stepsLeft > 0 {
			m.queue = append(m.queue, r)
			continue
		}
		if !r.settles {
			r.parked = true
			close(r.parkedCh)
			continue
		}
		r.settleFrom, r.settleSeq, r.settleAt = from, m.fk.Head(), time.Now()
		if st, _ := m.fk.ThreadStatus(r.thread); st != "completed" && st != "failed" && st != "interrupted" {
			return fmt.Errorf("%s: run %s should have settled, thread is %q (driver out of step)", m.name, r.id, st)
		}
		delete(p.busy, r.thread)
		close(r.settled)
		if m.onSettle != nil {
			m.onSettle(r)
		}
	}
	if len(m.queue) == 0 {
		m.queue = nil // drop the consumed prefix
	}
	return nil
}

func (m *machine) nextIdle() string {
	p := &m.pipe
	ring := p.threads
	if p.limit > 0 && p.limit < len(ring) {
		ring = ring[:p.limit]
	}
	for range ring {
		tid := ring[p.next%len(ring)]
		p.next = (p.next + 1) % len(ring)
		if !p.busy[tid] {
			return tid
		}
	}
	return ""
}

func (m *machine) close() {
	m.connMu.Lock()
	if m.conn != nil {
		_ = m.conn.Close()
	}
	m.connMu.Unlock()
	m.fk.Close()
}
