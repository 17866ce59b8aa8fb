package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime/metrics"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-faster/jx"
)

// hookSecret signs the deliveries, as a production receiver would want (the signing is part of
// the cost measured).
const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

type harness struct {
	cfg   Config
	rep   *Report
	dir   string
	state string

	machines []*machine // under load
	big      *machine   // holds the t3_thread thread; nil without one
	all      []*machine

	rec    *receiver
	conn   *connector
	extra  []*connector // replicas 2…N (Config.Replicas), on the same database
	agents agentPool
	// clients is the split harness's child (Config.Split): the receiver and the agents run
	// there; nil in one process.
	clients *clients

	drv         *driver // moves every machine's runs
	driveCancel context.CancelFunc

	roles struct {
		waits, push []slot
		polls       [][]slot // per poller
	}

	mu      sync.Mutex
	settled []*run // every run that settled, in settling order

	phaseRuns []phaseRuns // settled runs of each phase, for the final accounting
}

type phaseRuns struct {
	name string
	runs []*run
}

// slot is one thread of one machine.
type slot struct {
	m      *machine
	thread string
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Progress, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func (h *harness) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.rep.Warnings = append(h.rep.Warnings, msg)
	h.logf("warning: %s", msg)
}

// Run performs one load run. It returns the report (partial when err is not nil).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	h := &harness{cfg: cfg, rep: &Report{Date: time.Now(), Host: host(), Config: describe(cfg)}}
	start := time.Now()
	err := h.run(ctx)
	if cerr := h.cleanup(); err == nil {
		err = cerr
	}
	h.rep.Elapsed = time.Since(start)
	return h.rep, err
}

func describe(c Config) string {
	where := "binary"
	if c.InProcess {
		where = "in-process (profiling)"
	}
	if len(c.Split) > 0 {
		where += ", receiver and MCP clients in a second process"
	}
	if c.DatabaseURL != "" {
		where += fmt.Sprintf(", PostgreSQL store, %d replica(s)", max(c.Replicas, 1))
	} else {
		where += ", bbolt store"
	}
	if c.NoHook {
		where += ", events off (no T3CODE_MCP_HOOK_URL)"
	}
	if c.Compression != "" {
		where += ", compression " + c.Compression
	}
	if len(c.Phases) > 0 {
		where += fmt.Sprintf(", phases %v", c.Phases)
	}
	soak := ""
	if c.runs("soak") {
		soak = fmt.Sprintf(", soak %s at %.0f runs/s and %.1f churned threads/s, retention %s (pruned every %s), sampled every %s",
			c.Soak, c.SoakRate, c.SoakChurn, c.SoakRetention, soakPruneInterval(c.SoakRetention), c.SoakSample)
	}
	if c.ThreadControlPlane {
		soak = ", thread reads with T3's attempts and nodes" + soak
	}
	return fmt.Sprintf("connector %s, M=%d machines × T=%d threads, K=%d waits, E=%.0f/s (latency), peak %.0f/s, %s phases, script %s, "+
		"push %d runs, pollers %v over %s runs, t3_thread %d items × %d calls (and %d first calls), outage %s at %.0f/s on %d threads per machine, fake KeepRuns %d, log %s",
		where, c.Machines, c.Threads, c.Waits, c.Rate, c.PeakRate, c.Duration, c.Script, c.PushRuns, c.Pollers, c.RunLength,
		c.BigThreadItems, c.ThreadCalls, c.ThreadFirst, c.Outage, c.OutageRate, c.OutageThreads, c.KeepRuns, c.LogLevel) + soak
}

func (h *harness) run(ctx context.Context) error {
	if err := h.setup(ctx); err != nil {
		return err
	}
	if err := h.startConnector(ctx); err != nil {
		return err
	}
	dctx, dcancel := context.WithCancel(ctx)
	h.driveCancel = dcancel
	for _, m := range h.all {
		m.onSettle = h.onSettle
	}
	h.drv = newDriver(h.all)
	go h.drv.run(dctx)
	sessions := max(1, (h.cfg.Waits+h.cfg.WaitsPerSession-1)/h.cfg.WaitsPerSession)
	conns := h.cfg.Waits + h.cfg.PushRuns + 2*sessions + 16
	if h.clients != nil {
		ag, err := h.clients.agents(ctx, h.conn.base, sessions, conns)
		if err != nil {
			return fmt.Errorf("harness clients: %w", err)
		}
		h.agents = ag
	} else {
		ag, err := newAgents(ctx, h.conn.base, sessions, conns)
		if err != nil {
			return err
		}
		h.agents = ag
	}
	phases := []struct {
		name string
		run  func(context.Context) error
	}{{"thread", h.threadTool}, {"latency", h.latency}, {"compare", h.compare}, {"throughput", h.throughput}, {"outage", h.outage}, {"soak", h.soak}}
	for _, p := range phases {
		if !h.cfg.runs(p.name) || (p.name == "thread" && h.big == nil) {
			continue
		}
		restoreGC := phaseGC(h.cfg.InProcess)
		if h.cfg.OnPhase != nil {
			h.cfg.OnPhase(p.name, true)
		}
		err := p.run(ctx)
		if h.cfg.OnPhase != nil {
			h.cfg.OnPhase(p.name, false)
		}
		restoreGC()
		if err != nil {
			return fmt.Errorf("%s phase: %w", p.name, err)
		}
	}
	// Before the connector stops, let it take in everything T3 has sent: the accounting's "never
	// recorded" then means lost, not "still on its way in T3's stream when the run ended".
	if err := h.applied(ctx, 2*time.Minute); err != nil {
		h.warn("the connector had not applied every item T3 sent when it was stopped: %v (the accounting's never-recorded counts them)", err)
	}
	return nil
}

// applied waits, up to limit, until the connector has been sent every machine's head and has
// acknowledged every chunk of its open shell stream (it acknowledges a chunk once the detector has
// recorded it). Not AcksReceived >= ChunksSent: a chunk out when its socket died (a reconnect
// under load) is never acknowledged, its items come again on the new stream, and the totals
// stay one apart for good.
func (h *harness) applied(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for _, m := range h.all {
		for {
			st := m.fk.Stats()
			if m.maxSent.Load() >= st.Head && st.ShellStreams > 0 && st.ShellUnsettled == 0 {
				break
			}
			if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
				return fmt.Errorf("%s: sent up to %d of %d, %d shell streams open, %d of them with a chunk unacknowledged or items unsent (%d of %d chunks acknowledged in all, reconnects included): %w",
					m.name, m.maxSent.Load(), st.Head, st.ShellStreams, st.ShellUnsettled, st.AcksReceived, st.ChunksSent, err)
			}
		}
	}
	return nil
}

// ---- setup ----

// loadavg is the 1-minute load average: the machine is shared, and this says how busy it was.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (h *harness) onSettle(r *run) {
	h.mu.Lock()
	h.settled = append(h.settled, r)
	h.mu.Unlock()
}

func (h *harness) settledSince(i int) []*run {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*run(nil), h.settled[i:]...)
}

func (h *harness) settledCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.settled)
}

// usage measures the connector from a starting point.
type usageMark struct {
	at       time.Time
	cpu, own time.Duration
	sys      time.Duration // the connector's stime
	minflt   int64         // the connector's minor page faults
	faults   int64         // the harness's minor page faults
	gc       gcSample
	chunks   int64 // Chunks the fakes wrote
	wakeups  int64 // the harness's voluntary context switches
	clients  time.Duration
	kdamond  time.Duration // the memory monitor's threads' CPU (damon.go)
}

func (h *harness) mark() usageMark {
	ct, _ := h.conn.times()
	own, _ := procStat(os.Getpid())
	h.conn.resetRSSMax()
	return usageMark{time.Now(), ct.cpu, own.cpu, ct.sys, ct.minflt, own.minflt, readGC(), h.chunksSent(), ownWakeups(), h.clientsCPU(), kdamondCPU("/proc")}
}

func (h *harness) usageSince(m usageMark) Usage {
	ct, _ := h.conn.times()
	own, _ := procStat(os.Getpid())
	rss, _, _ := h.conn.memory()
	u := Usage{Wall: time.Since(m.at), CPU: ct.cpu - m.cpu, SysCPU: ct.sys - m.sys, MinorFaults: ct.minflt - m.minflt, MaxRSSKB: max(rss, h.conn.rssMaxKB.Load()), LoadAvg: loadavg(),
		HarnessCPU: own.cpu - m.own, HarnessFaults: own.minflt - m.faults,
		HarnessChunks: h.chunksSent() - m.chunks, HarnessWakeups: ownWakeups() - m.wakeups,
		KdamondCPU: max(0, kdamondCPU("/proc")-m.kdamond)}
	if h.clients != nil {
		u.ClientsCPU = h.clientsCPU() - m.clients
		u.HarnessCPU += u.ClientsCPU
	}
	gc := readGC()
	u.HarnessGCCPU, u.HarnessGCCycles, u.HarnessHeapLiveKB = gc.cpu-m.gc.cpu, gc.cycles-m.gc.cycles, gc.liveKB
	if u.Wall > 0 {
		u.Cores = u.CPU.Seconds() / u.Wall.Seconds()
		u.HarnessCores = u.HarnessCPU.Seconds() / u.Wall.Seconds()
	}
	return u
}

// clientsCPU is the split child's CPU so far (0 in one process).
func (h *harness) clientsCPU() time.Duration {
	if h.clients == nil {
		return 0
	}
	t, _ := procStat(h.clients.pid())
	return t.cpu
}

// sendTimes finds, for each run, when the frame with its settling shell row was sent.
func (h *harness) sendTimes(runs []*run) map[*run]time.Time {
	want := map[*machine]map[int64][]*run{}
	for _, r := range runs {
		if want[r.m] == nil {
			want[r.m] = map[int64][]*run{}
		}
		want[r.m][r.settleSeq] = append(want[r.m][r.settleSeq], r)
	}
	out := map[*run]time.Time{}
	for m, seqs := range want {
		m.mu.Lock()
		for _, s := range m.sent {
			for _, r := range seqs[s.seq] {
				if _, ok := out[r]; !ok {
					out[r] = s.at
				}
			}
		}
		m.mu.Unlock()
	}
	return out
}

// firstSendTimes finds, for each run, when the first frame that showed it settled was sent: its
// settling shell row (sendTimes) or an event of its settling step on its thread's own stream
// (sequences settleFrom < seq <= settleSeq: one step moves one run, so those are its events).
func (h *harness) firstSendTimes(runs []*run) map[*run]time.Time {
	out := h.sendTimes(runs)
	byMachine := map[*machine][]*run{}
	for _, r := range runs {
		byMachine[r.m] = append(byMachine[r.m], r)
	}
	for m, rs := range byMachine {
		m.mu.Lock()
		for _, s := range m.threadSent {
			for _, r := range rs {
				if s.seq > r.settleFrom && s.seq <= r.settleSeq {
					if t, ok := out[r]; !ok || s.at.Before(t) {
						out[r] = s.at
					}
				}
			}
		}
		m.mu.Unlock()
	}
	return out
}

// caughtUp waits until the connector has been sent every machine's head, and a little more for
// it to apply the last chunk.
func (h *harness) caughtUp(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, max(time.Minute, 2*h.cfg.Drain))
	defer cancel()
	for _, m := range h.all {
		head := m.fk.Head()
		for m.maxSent.Load() < head {
			if err := sleepCtx(cctx, time.Millisecond); err != nil {
				return fmt.Errorf("%s: the connector was not sent the head %d (at %d): %w", m.name, head, m.maxSent.Load(), err)
			}
		}
	}
	return sleepCtx(ctx, 300*time.Millisecond)
}

// stageHang starts hang runs on slots, released at the given times (farFuture: later), and
// waits until all have parked and the connector has seen them running.
func (h *harness) stageHang(ctx context.Context, slots []slot, rl role) ([]*run, error) {
	far := time.Now().Add(24 * time.Hour)
	by := map[*machine][]string{}
	for _, s := range slots {
		by[s.m] = append(by[s.m], s.thread)
	}
	index := map[string]*run{}
	var serr error
	if err := h.drv.do(ctx, slices.Collect(maps.Keys(by)), func(m *machine) {
		runs, err := m.startHang(by[m], rl, func(int) time.Time { return far })
		if err != nil && serr == nil {
			serr = err
		}
		for _, r := range runs {
			index[r.thread] = r
		}
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	out := make([]*run, len(slots))
	for i, s := range slots {
		out[i] = index[s.thread]
		select {
		case <-out[i].parkedCh:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, h.caughtUp(ctx)
}

// release sets the release time of staged hang runs.
func (h *harness) release(ctx context.Context, runs []*run, at func(i int) time.Time) error {
	by := map[*machine][]int{}
	for i, r := range runs {
		by[r.m] = append(by[r.m], i)
	}
	return h.drv.do(ctx, slices.Collect(maps.Keys(by)), func(m *machine) {
		for _, i := range by[m] {
			runs[i].release = at(i)
		}
	})
}

// wake is one t3_wait that returned.
type wake struct {
	r       *run
	at      time.Time // the answer read and decoded by the client
	rx      time.Time // its last bytes at the client's socket, the kernel's stamp (zero: none)
	reason  string
	err     error
	retries int
}

// awaitRun calls t3_wait on r's thread until it reports r settled (a wait issued before the
// connector saw r start returns at once with the thread's earlier state: it is issued again).
func (h *harness) awaitRun(ctx context.Context, session int, r *run) wake {
	w := wake{r: r}
	for {
		raw, t, err := h.agents.timedCall(ctx, session, "t3_wait", map[string]any{"thread_id": r.thread, "timeout": 3000})
		w.at, w.rx = t.end, t.rx // where the client runs: in the split child, its arrival there
		if trace.IsEnabled() {
			// The wake's arrival in a -trace (-harness-trace), joined by thread with the
			// connector's t3_wait marks (T3CODE_MCP_TRACE).
			trace.Log(ctx, "loadtest.t3_wait", r.thread)
		}
		if err != nil {
			w.err = err
			return w
		}
		var res waitResult
		if err := json.Unmarshal(raw, &res); err != nil {
			w.err = err
			return w
		}
		w.reason = res.Reason
		if res.State.LatestRun.ID == r.id && (res.Reason == "completed" || res.Reason == "failed" || res.Reason == "interrupted") {
			return w
		}
		if w.retries++; w.retries > 20 || ctx.Err() != nil {
			w.err = fmt.Errorf("t3_wait on %s returned %q for run %q, not run %s", r.thread, res.Reason, res.State.LatestRun.ID, r.id)
			return w
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			w.err = err
			return w
		}
	}
}

// setPipeline sets every load machine's rate-driven runs (rate 0 stops them) on the first limit
// pipeline threads of each machine (0: all of them).
func (h *harness) setPipeline(ctx context.Context, total float64, maxLag int64, limit int) error {
	now := time.Now()
	per := total / float64(len(h.machines))
	phase := make(map[*machine]time.Duration, len(h.machines))
	for i, m := range h.machines {
		phase[m] = pipelinePhase(i, len(h.machines), per, h.cfg.LockStep)
	}
	return h.drv.do(ctx, h.machines, func(m *machine) {
		p := &m.pipe
		p.rate, p.start, p.started, p.script, p.maxLag, p.limit = per, now.Add(-phase[m]), 0, h.cfg.Script, maxLag, limit
	})
}

// pipelinePhase is how far into its period machine i of n starts its pipeline at per runs per
// second: i/n of the period 1/per, so that the machines' runs arrive spread over the period at the
// total rate, as independent machines' do, instead of every machine starting (and settling) one
// in the same driver tick once per period — at 1,000/s on 100 machines, 100 transitions at once
// every 100 ms; at -e 20, 100 every 5 s. lockStep (Config.LockStep) keeps that lock-step, the
// harness's way before 12-02 15:47 UTC (a66865d): no phase.
func pipelinePhase(i, n int, per float64, lockStep bool) time.Duration {
	if lockStep || per <= 0 || n <= 0 {
		return 0
	}
	return time.Duration(float64(i) / float64(n) / per * float64(time.Second))
}

// idle waits until no machine has a queued run.
func (h *harness) idle(ctx context.Context) error {
	for {
		n := 0
		if err := h.drv.do(ctx, h.all, func(m *machine) { n += len(m.queue) }); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// pipelineStats sums the pipelines' counters of runs not started and resets them.
func (h *harness) pipelineStats(ctx context.Context) (ps pipeStats, err error) {
	err = h.drv.do(ctx, h.machines, func(m *machine) {
		ps.skipped += m.pipe.skipped
		ps.dropped += m.pipe.dropped
		ps.behind += m.pipe.behind
		m.pipe.skipped, m.pipe.dropped, m.pipe.behind = 0, 0, 0
	})
	return ps, err
}

type pipeStats struct{ skipped, dropped, behind int }

// eventLatencies joins watched runs with their webhooks: T3 frame sent → webhook received (lat),
// and → its bytes at the receiver's socket (rx, the deliveries the kernel stamped).
func (h *harness) eventLatencies(runs []*run) (lat, rx []time.Duration, missing int) {
	if h.cfg.NoHook {
		return nil, nil, 0
	}
	sent := h.sendTimes(runs)
	for _, r := range runs {
		if r.role == rolePoll {
			continue
		}
		d, ok := h.rec.forRun(r.id)
		s, sok := sent[r]
		if !ok || !sok {
			missing++
			continue
		}
		lat = append(lat, d.at.Sub(s))
		if !d.rx.IsZero() {
			rx = append(rx, d.rx.Sub(s))
		}
	}
	return lat, rx, missing
}

// drainEvents waits until every watched run in runs has its webhook, up to Drain.
func (h *harness) drainEvents(ctx context.Context, runs []*run) {
	if h.cfg.NoHook {
		return
	}
	deadline := time.Now().Add(h.cfg.Drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		missing := 0
		for _, r := range runs {
			if r.role != rolePoll {
				if _, ok := h.rec.forRun(r.id); !ok {
					missing++
				}
			}
		}
		if missing == 0 {
			return
		}
		_ = sleepCtx(ctx, 20*time.Millisecond)
	}
}

// ---- phases ----

// ---- teardown ----

// account sorts every watched run that settled into delivered (its webhook arrived), pending
// (recorded in the outbox, not delivered when the connector stopped) and lost (never recorded),
// reading the state file the stopped connector left.
func (h *harness) account() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := h.openStore(ctx)
	if err != nil {
		return err
	}
	pending, err := st.Pending(0)
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	inOutbox := map[string]bool{}
	for _, e := range pending {
		_ = jx.DecodeBytes(e.Body).ObjBytes(func(d *jx.Decoder, k []byte) error {
			if string(k) == "run_id" {
				v, err := d.Str()
				inOutbox[v] = true
				return err
			}
			return d.Skip()
		})
	}
	for _, p := range h.phaseRuns {
		a := Accounting{Phase: p.name}
		for _, r := range p.runs {
			if r.role == rolePoll {
				continue
			}
			a.Settled++
			if _, ok := h.rec.forRun(r.id); ok {
				a.Delivered++
			} else if inOutbox[r.id] {
				a.Pending++
			} else {
				a.Lost++
			}
		}
		h.rep.Accounting = append(h.rep.Accounting, a)
	}
	return nil
}

func (h *harness) cleanup() error {
	var errs []error
	if h.agents != nil {
		h.agents.close()
	}
	for i, c := range h.extra {
		if err := c.stop(); err != nil {
			errs = append(errs, fmt.Errorf("replica %d: %w", i+2, err))
		}
	}
	if h.conn != nil {
		if _, hwm, err := h.conn.memory(); err == nil {
			h.rep.PeakRSSKB = hwm
		}
		if cpu, err := h.conn.cpu(); err == nil {
			h.rep.TotalCPU = cpu
		}
		if err := h.conn.stop(); err != nil {
			errs = append(errs, fmt.Errorf("connector: %w", err))
		} else if !h.cfg.NoHook {
			if err := h.account(); err != nil {
				errs = append(errs, fmt.Errorf("accounting: %w", err))
			}
		}
	}
	if h.driveCancel != nil {
		h.driveCancel()
	}
	for _, m := range h.all {
		if m.driving {
			<-m.done
		}
		if e := m.err.Load(); e != nil && !errors.Is(*e, context.Canceled) {
			errs = append(errs, *e)
		}
		m.close()
	}
	if h.clients != nil {
		if err := h.clients.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if h.rec != nil {
		h.rec.close()
		rs := h.rec.stats()
		h.rep.Receiver = &rs
	}
	if h.cfg.WorkDir == "" && h.dir != "" {
		_ = os.RemoveAll(h.dir)
	}
	return errors.Join(errs...)
}

// gcSample is the harness process's garbage collection so far (runtime/metrics).
type gcSample struct {
	cpu    time.Duration // the runtime's estimate of the CPU spent on GC
	cycles int64
	liveKB int64 // heap marked live by the last cycle
}

// chunksSent is the Chunks every fake machine has written so far.
func (h *harness) chunksSent() int64 {
	var n int64
	for _, m := range h.all {
		n += m.fk.ChunksSent()
	}
	return n
}

// ownWakeups is this process's voluntary context switches so far (all its threads): each an OS
// thread that blocked (a parked scheduler thread, a read that found nothing) and was woken.
func ownWakeups() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Nvcsw
}

var gcMetrics = []string{"/cpu/classes/gc/total:cpu-seconds", "/gc/cycles/total:gc-cycles", "/gc/heap/live:bytes"}

func readGC() gcSample {
	s := make([]metrics.Sample, len(gcMetrics))
	for i, name := range gcMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	var g gcSample
	if s[0].Value.Kind() == metrics.KindFloat64 {
		g.cpu = time.Duration(s[0].Value.Float64() * float64(time.Second))
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		g.cycles = int64(s[1].Value.Uint64())
	}
	if s[2].Value.Kind() == metrics.KindUint64 {
		g.liveKB = int64(s[2].Value.Uint64() / 1024)
	}
	return g
}
