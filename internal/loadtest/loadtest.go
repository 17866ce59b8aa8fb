package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
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
	agents *agents

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
	if c.DatabaseURL != "" {
		where += fmt.Sprintf(", PostgreSQL store, %d replica(s)", max(c.Replicas, 1))
	} else {
		where += ", bbolt store"
	}
	if c.NoHook {
		where += ", events off (no T3CODE_MCP_HOOK_URL)"
	}
	if len(c.Phases) > 0 {
		where += fmt.Sprintf(", phases %v", c.Phases)
	}
	soak := ""
	if c.runs("soak") {
		soak = fmt.Sprintf(", soak %s at %.0f runs/s and %.1f churned threads/s, retention %s (pruned every %s), sampled every %s",
			c.Soak, c.SoakRate, c.SoakChurn, c.SoakRetention, soakPruneInterval(c.SoakRetention), c.SoakSample)
	}
	return fmt.Sprintf("connector %s, M=%d machines × T=%d threads, K=%d waits, E=%.0f/s (latency), peak %.0f/s, %s phases, script %s, "+
		"push %d runs, pollers %v over %s runs, t3_thread %d items × %d calls, outage %s at %.0f/s on %d threads per machine, fake KeepRuns %d, log %s",
		where, c.Machines, c.Threads, c.Waits, c.Rate, c.PeakRate, c.Duration, c.Script, c.PushRuns, c.Pollers, c.RunLength,
		c.BigThreadItems, c.ThreadCalls, c.Outage, c.OutageRate, c.OutageThreads, c.KeepRuns, c.LogLevel) + soak
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
		m.onSettle, m.driving = h.onSettle, true
		go m.drive(dctx)
	}
	sessions := max(1, (h.cfg.Waits+h.cfg.WaitsPerSession-1)/h.cfg.WaitsPerSession)
	var err error
	h.agents, err = newAgents(ctx, h.conn.base, sessions, h.cfg.Waits+h.cfg.PushRuns+2*sessions+16)
	if err != nil {
		return err
	}
	phases := []struct {
		name string
		run  func(context.Context) error
	}{{"thread", h.threadTool}, {"latency", h.latency}, {"compare", h.compare}, {"throughput", h.throughput}, {"outage", h.outage}, {"soak", h.soak}}
	for _, p := range phases {
		if !h.cfg.runs(p.name) || (p.name == "thread" && h.big == nil) {
			continue
		}
		if err := p.run(ctx); err != nil {
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

func (h *harness) setup(ctx context.Context) error {
	cfg := h.cfg
	h.dir = cfg.WorkDir
	if h.dir == "" {
		d, err := os.MkdirTemp("", "t3code-load-")
		if err != nil {
			return err
		}
		h.dir = d
	} else if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	h.state = filepath.Join(h.dir, "state")
	if err := os.RemoveAll(h.state); err != nil {
		return err
	}
	var err error
	if h.rec, err = newReceiver(); err != nil {
		return err
	}
	token := "t3load-" + fmt.Sprint(rand.Uint64())
	opts := t3fake.Options{Token: token, KeepRuns: cfg.KeepRuns}
	for i := 0; i < cfg.Machines; i++ {
		m, err := newMachine(i, fmt.Sprintf("load-%03d", i), opts)
		if err != nil {
			return err
		}
		h.machines = append(h.machines, m)
	}
	h.all = append(h.all, h.machines...)
	if cfg.BigThreadItems > 0 && cfg.runs("thread") {
		bo := opts
		bo.KeepRuns = -1
		if h.big, err = newMachine(cfg.Machines, "big", bo); err != nil {
			return err
		}
		h.all = append(h.all, h.big)
	}

	h.logf("seeding %d machines × %d threads, %d finished runs each", cfg.Machines, cfg.Threads, cfg.SeedRuns)
	t0 := time.Now()
	sem := make(chan struct{}, 4)
	errs := make(chan error, len(h.all))
	var wg sync.WaitGroup
	for _, m := range h.all {
		n := cfg.Threads
		if m == h.big {
			n = 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := m.seed(ctx, n); err != nil {
				errs <- err
				return
			}
			if m != h.big {
				if err := m.finishRuns(cfg.SeedRuns); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if h.big != nil {
		if err := h.big.bigThread((cfg.BigThreadItems + 4) / 5); err != nil {
			return err
		}
	}
	h.rep.Startup.SeedTime = time.Since(t0)
	h.rep.Startup.Threads = cfg.Machines*cfg.Threads + len(h.all) - len(h.machines)
	h.logf("seeded in %.1f s", h.rep.Startup.SeedTime.Seconds())

	// Roles: threads interleaved across machines, so every role spreads over all of them.
	var slots []slot
	for j := 0; j < cfg.Threads; j++ {
		for _, m := range h.machines {
			slots = append(slots, slot{m, m.threads[j]})
		}
	}
	take := func(n int) []slot {
		out := slots[:n:n]
		slots = slots[n:]
		return out
	}
	h.roles.waits = take(cfg.Waits)
	h.roles.push = take(cfg.PushRuns)
	unwatched := map[string]bool{}
	for _, p := range cfg.Pollers {
		ss := take(p.Runs)
		for _, s := range ss {
			unwatched[s.thread] = true
		}
		h.roles.polls = append(h.roles.polls, ss)
	}
	for _, s := range slots {
		s.m.pipe.threads = append(s.m.pipe.threads, s.thread)
	}

	// Every thread but the pollers' (and the big one) is tracked and watched, as if an agent had
	// dispatched or adopted it earlier: written into the state file before the connector starts.
	st, err := h.openStore(ctx)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	var tracked []store.Thread
	for _, m := range h.machines {
		for _, tid := range m.threads {
			if unwatched[tid] {
				continue
			}
			tracked = append(tracked, store.Thread{ID: tid, Machine: m.name, ProjectID: m.pid, ProjectTitle: "load",
				Title: "Load thread", Origin: "t3code-load", Watch: true, CreatedAt: now, UpdatedAt: now})
		}
	}
	err = st.Commit(store.Batch{Threads: tracked})
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	h.rep.Startup.Watched = len(tracked)
	return err
}

// openStore opens the connector's store while no connector runs: the bbolt file, or the
// PostgreSQL database (-database-url).
func (h *harness) openStore(ctx context.Context) (store.Store, error) {
	if h.cfg.DatabaseURL != "" {
		return pgstore.Open(ctx, h.cfg.DatabaseURL)
	}
	return store.Open(h.state)
}

// startReplicas starts replicas 2…N beside the first connector, each in a directory of its own,
// and waits until they serve.
func (h *harness) startReplicas(ctx context.Context, env []string) error {
	for i := 2; i <= h.cfg.Replicas; i++ {
		dir := filepath.Join(h.dir, fmt.Sprintf("replica%d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		c, err := startConnector(h.cfg.Binary, dir, append(slices.Clone(env), "T3CODE_MCP_STATE_DIR="+filepath.Join(dir, "state")))
		if err != nil {
			return err
		}
		h.extra = append(h.extra, c)
		if err := c.waitReady(ctx, len(h.all)); err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
	}
	if len(h.extra) > 0 {
		h.logf("%d more replicas serving on the same database", len(h.extra))
	}
	return nil
}

func (h *harness) startConnector(ctx context.Context) error {
	cfgPath := filepath.Join(h.dir, "t3code.toml")
	if err := writeConfig(cfgPath, h.all); err != nil {
		return err
	}
	env := []string{
		"T3CODE_MCP_CONFIG=" + cfgPath,
		"T3CODE_MCP_STATE_DIR=" + h.state,
		"T3CODE_MCP_LOG_LEVEL=" + h.cfg.LogLevel,
		fmt.Sprintf("T3CODE_MCP_MAX_WAITS=%d", max(2000, h.cfg.Waits+h.cfg.PushRuns+100)),
		TokenEnv + "=" + h.machines[0].token,
	}
	env = append(env, h.cfg.soakEnv()...)
	if !h.cfg.NoHook {
		env = append(env, "T3CODE_MCP_HOOK_URL="+h.rec.url, "T3CODE_MCP_HOOK_SECRET="+hookSecret)
	}
	if h.cfg.DatabaseURL != "" {
		env = append(env, "T3CODE_MCP_DATABASE_URL="+h.cfg.DatabaseURL)
	}
	t0 := time.Now()
	var err error
	if h.cfg.InProcess {
		h.logf("starting the connector in-process with %d machines", len(h.all))
		h.conn, err = startInProcess(h.dir, env)
	} else {
		h.logf("starting %s serve with %d machines", h.cfg.Binary, len(h.all))
		h.conn, err = startConnector(h.cfg.Binary, h.dir, env)
	}
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := h.conn.waitReady(rctx, len(h.all)); err != nil {
		return err
	}
	if err := h.startReplicas(rctx, env); err != nil {
		return err
	}
	h.rep.Startup.Ready = time.Since(t0)
	// Synced: every machine's snapshot chunk was acknowledged, which the connector does once it
	// has applied it and the detector has recorded every watched thread's baseline.
	for _, m := range h.all {
		for m.fk.Stats().AcksReceived < 1 {
			if err := sleepCtx(rctx, time.Millisecond); err != nil {
				return fmt.Errorf("%s: snapshot never acknowledged: %w", m.name, err)
			}
		}
	}
	h.rep.Startup.Synced = time.Since(t0)
	h.logf("ready after %s, synced after %s", ms(h.rep.Startup.Ready), ms(h.rep.Startup.Synced))
	// Idle: 2 s after the last snapshot was acknowledged (the connector returns start-up garbage
	// to the OS once its snapshot gate has been quiet for 0.5 s; internal/watch/gate.go).
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	st, err := h.conn.status()
	if err != nil {
		return err
	}
	su := &h.rep.Startup
	su.IdleRSS, su.RssAnonKB, su.RssFileKB = st["VmRSS"], st["RssAnon"], st["RssFile"]
	if !h.cfg.InProcess {
		if m, err := h.conn.metrics(ctx); err == nil {
			su.HeapInuseKB = int64(m["go_memstats_heap_inuse_bytes"]) / 1024
			su.HeapRetainKB = int64(m["go_memstats_heap_idle_bytes"]-m["go_memstats_heap_released_bytes"]) / 1024
			su.NextGCKB = int64(m["go_memstats_next_gc_bytes"]) / 1024
		}
	}
	if fi, err := os.Stat(filepath.Join(h.state, store.FileName)); err == nil {
		su.StateFileKB = fi.Size() / 1024
	}
	h.logf("idle RSS %s", mb(su.IdleRSS))
	if h.cfg.AfterStartup != nil {
		h.cfg.AfterStartup()
	}
	return err
}

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
}

func (h *harness) mark() usageMark {
	cpu, _ := h.conn.cpu()
	own, _ := procCPU(os.Getpid())
	h.conn.resetRSSMax()
	return usageMark{time.Now(), cpu, own}
}

func (h *harness) usageSince(m usageMark) Usage {
	cpu, _ := h.conn.cpu()
	own, _ := procCPU(os.Getpid())
	rss, _, _ := h.conn.memory()
	u := Usage{Wall: time.Since(m.at), CPU: cpu - m.cpu, MaxRSSKB: max(rss, h.conn.rssMaxKB.Load()), LoadAvg: loadavg()}
	if u.Wall > 0 {
		u.Cores = u.CPU.Seconds() / u.Wall.Seconds()
		u.HarnessCores = (own - m.own).Seconds() / u.Wall.Seconds()
	}
	return u
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
	for m, threads := range by {
		var runs []*run
		var serr error
		if err := m.do(ctx, func() { runs, serr = m.startHang(threads, rl, func(int) time.Time { return far }) }); err != nil {
			return nil, err
		}
		if serr != nil {
			return nil, serr
		}
		for _, r := range runs {
			index[r.thread] = r
		}
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
	for m, idx := range by {
		if err := m.do(ctx, func() {
			for _, i := range idx {
				runs[i].release = at(i)
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// wake is one t3_wait that returned.
type wake struct {
	r       *run
	at      time.Time
	reason  string
	err     error
	retries int
}

// awaitRun calls t3_wait on r's thread until it reports r settled (a wait issued before the
// connector saw r start returns at once with the thread's earlier state: it is issued again).
func (h *harness) awaitRun(ctx context.Context, session int, r *run) wake {
	w := wake{r: r}
	for {
		raw, err := h.agents.call(ctx, session, "t3_wait", map[string]any{"thread_id": r.thread, "timeout": 3000})
		w.at = time.Now()
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
	for _, m := range h.machines {
		if err := m.do(ctx, func() {
			p := &m.pipe
			p.rate, p.start, p.started, p.script, p.maxLag, p.limit = per, now, 0, h.cfg.Script, maxLag, limit
		}); err != nil {
			return err
		}
	}
	return nil
}

// idle waits until no machine has a queued run.
func (h *harness) idle(ctx context.Context) error {
	for _, m := range h.all {
		for {
			var n int
			if err := m.do(ctx, func() { n = len(m.queue) }); err != nil {
				return err
			}
			if n == 0 {
				break
			}
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// pipelineStats sums the pipelines' counters of runs not started and resets them.
func (h *harness) pipelineStats(ctx context.Context) (ps pipeStats, err error) {
	for _, m := range h.machines {
		if err := m.do(ctx, func() {
			ps.skipped += m.pipe.skipped
			ps.dropped += m.pipe.dropped
			ps.behind += m.pipe.behind
			m.pipe.skipped, m.pipe.dropped, m.pipe.behind = 0, 0, 0
		}); err != nil {
			return ps, err
		}
	}
	return ps, nil
}

type pipeStats struct{ skipped, dropped, behind int }

// eventLatencies joins watched runs with their webhooks: T3 frame sent → webhook received.
func (h *harness) eventLatencies(runs []*run) (lat []time.Duration, missing int) {
	if h.cfg.NoHook {
		return nil, 0
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
	}
	return lat, missing
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

func (h *harness) threadTool(ctx context.Context) error {
	tid := h.big.threads[0]
	h.logf("t3_thread on a %d-item thread × %d", h.cfg.BigThreadItems, h.cfg.ThreadCalls)
	u := h.mark()
	var lat []time.Duration
	for i := 0; i <= h.cfg.ThreadCalls; i++ {
		t0 := time.Now()
		if _, err := h.agents.call(ctx, 0, "t3_thread", map[string]any{"thread_id": tid}); err != nil {
			return err
		}
		if i > 0 { // the first call warms the connection and caches
			lat = append(lat, time.Since(t0))
		}
	}
	usage := h.usageSince(u)
	// The same read straight from the fake, for the share of the fake T3 in the above.
	var direct []time.Duration
	size := 0
	for i := 0; i <= h.cfg.ThreadCalls; i++ {
		t0 := time.Now()
		n, err := h.big.getThread(ctx, tid)
		if err != nil {
			return err
		}
		if i > 0 {
			direct, size = append(direct, time.Since(t0)), n
		}
	}
	bounded, err := h.big.get(ctx, "/api/orchestration/threads/"+tid+"/bounded")
	if err != nil {
		return err
	}
	h.rep.ThreadTool = &ThreadTool{Items: 5 * ((h.cfg.BigThreadItems + 4) / 5), Bytes: size, BoundedBytes: bounded, Latency: dist(lat), Direct: dist(direct), Usage: usage,
		CPUPerCall: usage.CPU / time.Duration(h.cfg.ThreadCalls+1)}
	h.logf("t3_thread: %s; the fake's GET alone: %s", h.rep.ThreadTool.Latency, h.rep.ThreadTool.Direct)
	return nil
}

func (h *harness) latency(ctx context.Context) error {
	cfg := h.cfg
	rep := &Latency{Offered: cfg.Rate}
	h.rep.Latency = rep
	h.logf("latency phase: staging %d waits", cfg.Waits)
	waitRuns, err := h.stageHang(ctx, h.roles.waits, roleWait)
	if err != nil {
		return err
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wakes := make(chan wake, len(waitRuns))
	for i, r := range waitRuns {
		go func() { wakes <- h.awaitRun(wctx, i/cfg.WaitsPerSession, r) }()
	}
	// All K waits blocked at once before anything is released.
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := h.conn.metric(ctx, "t3code_mcp_active_waits")
		if err != nil {
			return err
		}
		rep.ActiveWaits = int(n)
		if int(n) >= len(waitRuns) {
			break
		}
		if time.Now().After(deadline) {
			h.warn("only %d of %d t3_wait calls were blocked after 60 s", int(n), len(waitRuns))
			break
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	h.logf("latency phase: %d waits blocked; %.0f runs/s for %s", rep.ActiveWaits, cfg.Rate, cfg.Duration)

	first := h.settledCount()
	u := h.mark()
	start := time.Now()
	if err := h.setPipeline(ctx, cfg.Rate, 0, 0); err != nil {
		return err
	}
	// Releases spread over the middle 80% of the phase.
	if err := h.release(ctx, waitRuns, func(i int) time.Time {
		return start.Add(cfg.Duration/10 + time.Duration(float64(cfg.Duration)*0.8*float64(i)/float64(max(1, len(waitRuns)))))
	}); err != nil {
		return err
	}
	if err := sleepCtx(ctx, cfg.Duration); err != nil {
		return err
	}
	if err := h.setPipeline(ctx, 0, 0, 0); err != nil {
		return err
	}
	inWindow := h.settledCount() - first
	rep.Settled = float64(inWindow) / time.Since(start).Seconds()
	rep.Usage = h.usageSince(u)
	if err := h.idle(ctx); err != nil {
		return err
	}
	var got []wake
	timeout := time.After(cfg.Drain)
collect:
	for len(got) < len(waitRuns) {
		select {
		case w := <-wakes:
			got = append(got, w)
		case <-timeout:
			break collect
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	wcancel()
	runs := h.settledSince(first)
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"latency", runs})
	h.drainEvents(ctx, runs)
	lat, missing := h.eventLatencies(runs)
	rep.Events, rep.MissingEvent = dist(lat), missing
	sent := h.sendTimes(waitRuns)
	var wl []time.Duration
	for _, w := range got {
		rep.EarlyWakes += w.retries
		s, ok := sent[w.r]
		if w.err != nil || !ok {
			if w.err != nil && len(h.rep.Warnings) < 20 {
				h.warn("wait: %v", w.err)
			}
			rep.MissingWake++
			continue
		}
		wl = append(wl, w.at.Sub(s))
	}
	rep.MissingWake += len(waitRuns) - len(got)
	rep.Wake = dist(wl)
	ps, err := h.pipelineStats(ctx)
	rep.Skipped, rep.Behind = ps.skipped, ps.behind
	h.logf("latency phase: events %s; wakes %s", rep.Events, rep.Wake)
	return err
}

func (h *harness) throughput(ctx context.Context) error {
	cfg := h.cfg
	rep := &Throughput{Offered: cfg.PeakRate}
	h.rep.Throughput = rep
	perMachine := cfg.PeakRate / float64(len(h.machines))
	seqsPerRun := map[string]float64{"default": 13, "fail": 6}[cfg.Script]
	maxLag := max(500, int64(perMachine*seqsPerRun/4))
	hb0, err := h.conn.health(ctx)
	if err != nil {
		h.warn("throughput phase: /healthz before: %v", err)
	}
	recv0 := h.rec.count()
	first := h.settledCount()
	h.logf("throughput phase: offering %.0f runs/s for %s", cfg.PeakRate, cfg.Duration)
	u := h.mark()
	start := time.Now()
	if err := h.setPipeline(ctx, cfg.PeakRate, maxLag, 0); err != nil {
		return err
	}
	if err := sleepCtx(ctx, cfg.Duration); err != nil {
		return err
	}
	if err := h.setPipeline(ctx, 0, 0, 0); err != nil {
		return err
	}
	wall := time.Since(start).Seconds()
	settled := h.settledCount() - first
	recv1 := h.rec.count()
	hb1, err := h.conn.health(ctx)
	if err != nil {
		h.warn("throughput phase: /healthz after: %v (committed and backlog are not known)", err)
	}
	rep.Usage = h.usageSince(u)
	rep.Settled = float64(settled) / wall
	rep.Delivered = float64(recv1-recv0) / wall
	rep.Committed = float64((recv1+hb1.Events.Pending)-(recv0+hb0.Events.Pending)) / wall
	rep.Backlog = hb1.Events.Pending
	ps, err := h.pipelineStats(ctx)
	if err != nil {
		return err
	}
	rep.Skipped, rep.Dropped, rep.Behind = ps.skipped, ps.dropped, ps.behind
	h.logf("throughput phase: settled %.0f/s, committed %.0f/s, delivered %.0f/s, backlog %d", rep.Settled, rep.Committed, rep.Delivered, rep.Backlog)
	if err := h.idle(ctx); err != nil {
		return err
	}
	drainStart := time.Now()
	for time.Since(drainStart) < cfg.Drain && !cfg.NoHook {
		hb, err := h.conn.health(ctx)
		if err != nil {
			h.warn("throughput phase: /healthz while draining: %v", err)
			break
		}
		rep.Left = hb.Events.Pending
		if hb.Events.Pending == 0 {
			rep.Drained = time.Since(drainStart)
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	runs := h.settledSince(first)
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"throughput", runs})
	lat, missing := h.eventLatencies(runs)
	rep.Events = dist(lat)
	if missing > 0 && rep.Left == 0 {
		h.warn("throughput phase: %d settled runs have no webhook", missing)
	}
	return nil
}

func (h *harness) compare(ctx context.Context) error {
	cfg := h.cfg
	if cfg.PushRuns == 0 && len(cfg.Pollers) == 0 {
		return nil
	}
	h.logf("comparison: staging %d push runs and pollers %v", cfg.PushRuns, cfg.Pollers)
	before := h.requests()
	push, err := h.stageHang(ctx, h.roles.push, rolePush)
	if err != nil {
		return err
	}
	polls := make([][]*run, len(cfg.Pollers))
	for i, ss := range h.roles.polls {
		if polls[i], err = h.stageHang(ctx, ss, rolePoll); err != nil {
			return err
		}
	}
	maxPoll := time.Duration(0)
	for _, p := range cfg.Pollers {
		maxPoll = max(maxPoll, p.Interval)
	}
	phaseCtx, cancel := context.WithTimeout(ctx, cfg.RunLength+maxPoll+cfg.Drain)
	defer cancel()

	// Start every approach, then release the runs at random times within RunLength.
	start := time.Now()
	wakes := make(chan wake, len(push))
	for i, r := range push {
		go func() { wakes <- h.awaitRun(phaseCtx, i/cfg.WaitsPerSession, r) }()
	}
	type noticed struct {
		r   *run
		at  time.Time
		req int64
		err error
	}
	pollOut := make([]chan noticed, len(polls))
	for i, runs := range polls {
		pollOut[i] = make(chan noticed, len(runs))
		iv := cfg.Pollers[i].Interval
		for _, r := range runs {
			go func() {
				at, n, err := poll(phaseCtx, r, iv)
				pollOut[i] <- noticed{r, at, n, err}
			}()
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var all []*run
	all = append(all, push...)
	for _, runs := range polls {
		all = append(all, runs...)
	}
	offsets := make([]time.Duration, len(all))
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(cfg.RunLength)) + 1)
	}
	if err := h.release(ctx, all, func(i int) time.Time { return start.Add(offsets[i]) }); err != nil {
		return err
	}

	// The push path: t3_wait results and webhooks.
	waitA := Approach{Name: "connector t3_wait (push)", Runs: len(push)}
	hookA := Approach{Name: "connector webhook (push)", Runs: len(push)}
	var wl, hl []time.Duration
	for range push {
		var w wake
		select {
		case w = <-wakes:
		case <-phaseCtx.Done():
		}
		if w.r == nil || w.err != nil {
			continue
		}
		waitA.Noticed++
		wl = append(wl, w.at.Sub(w.r.settleAt))
	}
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"compare (push)", push})
	h.drainEvents(phaseCtx, push)
	for _, r := range push {
		if d, ok := h.rec.forRun(r.id); ok && !r.settleAt.IsZero() {
			hookA.Noticed++
			hl = append(hl, d.at.Sub(r.settleAt))
		}
	}
	waitA.Notice, hookA.Notice = dist(wl), dist(hl)

	var pollA []Approach
	var polled int64
	for i, runs := range polls {
		a := Approach{Name: fmt.Sprintf("HTTP poller every %s", cfg.Pollers[i].Interval), Runs: len(runs)}
		var pl []time.Duration
		for range runs {
			n := <-pollOut[i]
			a.Requests += n.req
			if n.err == nil {
				a.Noticed++
				pl = append(pl, n.at.Sub(n.r.settleAt))
			}
		}
		polled += a.Requests
		a.Notice = dist(pl)
		a.PerRun = float64(a.Requests) / float64(max(1, a.Noticed))
		a.ByRoute = map[string]int64{routeThread: a.Requests}
		pollA = append(pollA, a)
	}
	if err := h.idle(ctx); err != nil {
		return err
	}
	// What the connector asked T3 for: every HTTP request the fakes served in the phase, less
	// the pollers' own.
	after := h.requests()
	byRoute := map[string]int64{}
	var total int64
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			byRoute[k] = d
			total += d
		}
	}
	byRoute[routeThread] -= polled
	if byRoute[routeThread] == 0 {
		delete(byRoute, routeThread)
	}
	total -= polled
	waitA.Requests, waitA.ByRoute = total, byRoute
	waitA.PerRun = float64(total) / float64(max(1, len(push)))
	hookA.Requests, hookA.PerRun, hookA.ByRoute = waitA.Requests, waitA.PerRun, byRoute

	base := waitA
	h.rep.Compare = []Approach{waitA}
	if !cfg.NoHook {
		h.rep.Compare = append(h.rep.Compare, hookA)
	}
	h.rep.Compare = append(h.rep.Compare, pollA...)
	for i := range h.rep.Compare {
		a := &h.rep.Compare[i]
		if base.Notice.Mean > 0 {
			a.NoticeRatio = float64(a.Notice.Mean) / float64(base.Notice.Mean)
		}
		if base.PerRun > 0 {
			a.RequestX = a.PerRun / base.PerRun
		}
		h.logf("comparison: %s: %s, %.2f requests/run", a.Name, a.Notice, a.PerRun)
	}
	return nil
}

const routeThread = "GET /api/orchestration/threads/{id}"

// requests sums the fakes' HTTP request counters by route.
func (h *harness) requests() map[string]int64 {
	out := map[string]int64{}
	for _, m := range h.all {
		for k, v := range m.fk.Stats().HTTPRequests {
			out[k] += v
		}
	}
	return out
}

// poll reads r's thread every interval until r has settled, as a polling MCP server would; it
// returns when it noticed and how many requests it made.
func poll(ctx context.Context, r *run, interval time.Duration) (time.Time, int64, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var n int64
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, n, ctx.Err()
		case <-t.C:
		}
		n++
		snap, err := r.m.client.Thread(ctx, r.thread)
		at := time.Now()
		if err != nil {
			return at, n, err
		}
		for _, run := range snap.Projection.Runs {
			if run.ID == r.id && (run.Status == "completed" || run.Status == "failed" || run.Status == "interrupted") {
				return at, n, nil
			}
		}
	}
}

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
	if h.rec != nil {
		h.rec.close()
	}
	if h.cfg.WorkDir == "" && h.dir != "" {
		_ = os.RemoveAll(h.dir)
	}
	return errors.Join(errs...)
}
