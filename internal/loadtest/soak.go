package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
)

// Soak is the soak phase: transitions at a steady rate for a long time with a short retention,
// the connector's memory and state file sampled throughout, to show that what it keeps is
// bounded (issue 13.7): delivered events leave the state file after SoakRetention, tracked
// threads nobody watches any more leave it after SoakRetention too, and RSS stops growing.
type Soak struct {
	Duration      time.Duration `json:"duration_ns"`       // how long runs were offered
	Offered       float64       `json:"offered_per_s"`     // runs per second offered on the watched threads
	Retention     time.Duration `json:"retention_ns"`      // T3CODE_MCP_HOOK_RETENTION and T3CODE_MCP_THREAD_RETENTION
	PruneInterval time.Duration `json:"prune_interval_ns"` // T3CODE_MCP_PRUNE_INTERVAL
	Settled       int           `json:"settled"`           // watched runs that settled in T3
	Delivered     int           `json:"delivered"`         // of Settled, webhooks received by the end of the drain
	Churned       int           `json:"threads_churned"`   // new threads watched, unwatched and archived
	ChurnErrors   int           `json:"churn_errors"`      // churn steps that failed (each logged as a warning, the first few)
	Samples       []SoakSample  `json:"samples"`
	// WarmUp is when the judged window starts: by then every kind of state has been through its
	// retention and a prune twice.
	WarmUp time.Duration `json:"warm_up_ns"`
	// The growth figures compare the highest value in the last third of the samples after WarmUp
	// with the highest in the first third (1.0: no growth); 0 when too few samples to judge.
	RSSGrowth     float64 `json:"rss_growth"`
	HeapGrowth    float64 `json:"heap_growth"`
	StateGrowth   float64 `json:"state_file_growth"`
	TrackedGrowth float64 `json:"tracked_growth"`
	// Flat: RSS, the live heap, the state file and the tracked threads each grew by at most
	// soakFlatGrowth over the judged window.
	Flat  bool  `json:"flat"`
	Usage Usage `json:"usage"`
}

// SoakSample is one observation of the connector during the soak.
type SoakSample struct {
	At          time.Duration `json:"at_ns"`         // since the soak began
	RSSKB       int64         `json:"rss_kb"`        // VmRSS
	HeapInuseKB int64         `json:"heap_inuse_kb"` // go_memstats_heap_inuse_bytes
	Goroutines  int           `json:"goroutines"`    // go_goroutines
	StateFileKB int64         `json:"state_file_kb"` // t3code-mcp.db
	Tracked     int           `json:"tracked"`       // tracked threads (t3_watch's list)
	Watched     int           `json:"watched"`       // of which watched
	Pending     int           `json:"pending"`       // events pending in the outbox (/healthz)
	Received    int           `json:"received"`      // distinct webhooks received since the soak began
	LoadAvg     string        `json:"loadavg"`
}

// soakFlatGrowth is the growth the soak still calls flat: bbolt grows its file in steps and the
// Go runtime returns memory to the OS lazily, so small steps are not a trend.
const soakFlatGrowth = 1.10

// soakPruneInterval is the prune interval the soak gives the connector for a retention: short
// enough that state leaves soon after its retention ends.
func soakPruneInterval(retention time.Duration) time.Duration {
	return max(time.Second, retention/4)
}

// soakEnv is the connector's environment for a run with the soak phase.
func (c Config) soakEnv() []string {
	if !c.runs("soak") {
		return nil
	}
	return []string{
		"T3CODE_MCP_HOOK_RETENTION=" + c.SoakRetention.String(),
		"T3CODE_MCP_THREAD_RETENTION=" + c.SoakRetention.String(),
		"T3CODE_MCP_PRUNE_INTERVAL=" + soakPruneInterval(c.SoakRetention).String(),
	}
}

func (h *harness) soak(ctx context.Context) error {
	cfg := h.cfg
	if cfg.NoHook {
		h.warn("soak phase: events are off (-no-hook): delivered events are not exercised")
	}
	rep := &Soak{Duration: cfg.Soak, Offered: cfg.SoakRate, Retention: cfg.SoakRetention, PruneInterval: soakPruneInterval(cfg.SoakRetention)}
	rep.WarmUp = 2 * (rep.Retention + rep.PruneInterval)
	h.rep.Soak = rep
	if err := h.idle(ctx); err != nil {
		return err
	}
	h.logf("soak phase: %.0f runs/s and %.1f watched-then-dropped threads/s for %s; retention %s, pruned every %s",
		cfg.SoakRate, cfg.SoakChurn, cfg.Soak, rep.Retention, rep.PruneInterval)
	first := h.settledCount()
	recv0 := h.rec.count()
	u := h.mark()
	start := time.Now()
	if err := h.setPipeline(ctx, cfg.SoakRate, 0, 0); err != nil {
		return err
	}
	cctx, stopChurn := context.WithCancel(ctx)
	var churn churnResult
	churnDone := make(chan struct{})
	go func() {
		defer close(churnDone)
		churn = h.churn(cctx)
	}()

	sample := func() {
		s := h.soakSample(ctx, start, recv0)
		rep.Samples = append(rep.Samples, s)
		h.logf("soak %4.0fs: RSS %s, heap %s, state file %s, %d tracked (%d watched), %d pending, %d received, %d goroutines, load %s",
			s.At.Seconds(), mb(s.RSSKB), mb(s.HeapInuseKB), mb(s.StateFileKB), s.Tracked, s.Watched, s.Pending, s.Received, s.Goroutines, s.LoadAvg)
	}
	sample()
	tick := time.NewTicker(cfg.SoakSample)
	end := time.NewTimer(cfg.Soak)
	func() {
		defer tick.Stop()
		defer end.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-end.C:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	stopChurn()
	<-churnDone
	if err := h.setPipeline(ctx, 0, 0, 0); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sample()
	rep.Usage = h.usageSince(u)
	rep.Churned, rep.ChurnErrors = churn.done, churn.failed
	for _, e := range churn.first {
		h.warn("soak phase: churning a thread: %s", e)
	}
	if err := h.idle(ctx); err != nil {
		return err
	}
	runs := h.settledSince(first)
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"soak", runs})
	h.drainEvents(ctx, runs)
	rep.Settled = len(runs)
	for _, r := range runs {
		if _, ok := h.rec.forRun(r.id); ok {
			rep.Delivered++
		}
	}
	rep.judge()
	if rep.RSSGrowth == 0 {
		h.warn("soak phase: too few samples after the warm-up (%s) to judge growth: run longer or sample more often", rep.WarmUp)
	}
	h.logf("soak phase: %d runs settled, %d delivered, %d threads churned (%d failed); growth over the judged window: RSS ×%.2f, heap ×%.2f, state file ×%.2f, tracked ×%.2f: flat %v",
		rep.Settled, rep.Delivered, rep.Churned, rep.ChurnErrors, rep.RSSGrowth, rep.HeapGrowth, rep.StateGrowth, rep.TrackedGrowth, rep.Flat)
	return nil
}

// judge computes the growth figures and the verdict from the samples after the warm-up.
func (s *Soak) judge() {
	var win []SoakSample
	for _, x := range s.Samples {
		if x.At >= s.WarmUp {
			win = append(win, x)
		}
	}
	if len(win) < 3 {
		return
	}
	third := len(win) / 3
	early, late := win[:third], win[len(win)-third:]
	growth := func(v func(SoakSample) int64) float64 {
		hi := func(xs []SoakSample) int64 {
			m := int64(0)
			for _, x := range xs {
				m = max(m, v(x))
			}
			return m
		}
		a, b := hi(early), hi(late)
		if a == 0 {
			if b == 0 {
				return 1
			}
			return float64(b)
		}
		return float64(b) / float64(a)
	}
	s.RSSGrowth = growth(func(x SoakSample) int64 { return x.RSSKB })
	s.HeapGrowth = growth(func(x SoakSample) int64 { return x.HeapInuseKB })
	s.StateGrowth = growth(func(x SoakSample) int64 { return x.StateFileKB })
	s.TrackedGrowth = growth(func(x SoakSample) int64 { return int64(x.Tracked) })
	s.Flat = !slices.ContainsFunc([]float64{s.RSSGrowth, s.HeapGrowth, s.StateGrowth, s.TrackedGrowth}, func(g float64) bool { return g > soakFlatGrowth })
}

func (h *harness) soakSample(ctx context.Context, start time.Time, recv0 int) SoakSample {
	s := SoakSample{At: time.Since(start), LoadAvg: loadavg(), Received: h.rec.count() - recv0}
	if st, err := h.conn.status(); err == nil {
		s.RSSKB = st["VmRSS"]
	}
	if m, err := h.conn.metrics(ctx); err == nil {
		s.HeapInuseKB = int64(m["go_memstats_heap_inuse_bytes"]) / 1024
		s.Goroutines = int(m["go_goroutines"])
	}
	if fi, err := os.Stat(filepath.Join(h.state, store.FileName)); err == nil {
		s.StateFileKB = fi.Size() / 1024
	}
	if hb, err := h.conn.health(ctx); err == nil {
		s.Pending = hb.Events.Pending
	}
	if raw, err := h.agents.call(ctx, 0, "t3_watch", map[string]any{}); err == nil {
		var out struct {
			Threads []struct {
				Watching bool `json:"watching"`
			} `json:"threads"`
		}
		if json.Unmarshal(raw, &out) == nil {
			s.Tracked = len(out.Threads)
			for _, t := range out.Threads {
				if t.Watching {
					s.Watched++
				}
			}
		}
	}
	return s
}

// churnResult is what churn did: threads churned, steps that failed and the first errors.
type churnResult struct {
	done, failed int
	first        []string
}

// churn adds threads to the fakes at cfg.SoakChurn per second, turns their events on and off
// through t3_watch (each becomes a tracked thread nobody watches, for the connector to forget
// after its retention) and archives them in T3 (the watcher then drops their rows).
func (h *harness) churn(ctx context.Context) (res churnResult) {
	if h.cfg.SoakChurn <= 0 {
		return res
	}
	every := time.Duration(float64(time.Second) / h.cfg.SoakChurn)
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return res
		case <-t.C:
		}
		m := h.machines[i%len(h.machines)]
		if err := h.churnOne(ctx, m, i); err != nil {
			if ctx.Err() != nil {
				return res
			}
			if res.failed++; len(res.first) < 3 {
				res.first = append(res.first, fmt.Sprintf("%s: %v", m.name, err))
			}
			continue
		}
		res.done++
	}
}

func (h *harness) churnOne(ctx context.Context, m *machine, i int) error {
	id := t3.NewID("thread")
	if err := m.fk.AddThreadWithID(m.pid, id, fmt.Sprintf("Soak thread %d", i)); err != nil {
		return err
	}
	defer m.fk.ArchiveThread(id)
	// The connector learns of the thread from T3's stream: t3_watch finds it once its row is in.
	var err error
	for try := 0; try < 200; try++ {
		if _, err = h.agents.call(ctx, i, "t3_watch", map[string]any{"thread_id": id, "enabled": true}); err == nil {
			break
		}
		if serr := sleepCtx(ctx, 50*time.Millisecond); serr != nil {
			return serr
		}
	}
	if err != nil {
		return err
	}
	_, err = h.agents.call(ctx, i, "t3_watch", map[string]any{"thread_id": id, "enabled": false})
	return err
}
