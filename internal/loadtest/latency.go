package loadtest

import (
	"context"
	"fmt"
	"time"
)

// This file: the latency phase: t3_thread reads and t3_wait wake-ups, and the event latency of
// the runs they settle.

// threadResults is t3code_mcp_thread_results_total, the connector's count of t3_thread results
// by where it took them from (source: feed, read).
const threadResults = "t3code_mcp_thread_results_total"

// threadSources is the connector's threadResults by source now; nil when it has none.
func (h *harness) threadSources(ctx context.Context) map[string]float64 {
	by, found, err := h.conn.counterBy(ctx, threadResults, "source")
	if err != nil || !found {
		return nil
	}
	return by
}

// sourcesSince is what threadResults gained since before; nil when the connector has none.
func sourcesSince(before, after map[string]float64) map[string]int64 {
	if after == nil {
		return nil
	}
	out := map[string]int64{}
	for k, v := range after {
		if d := int64(v - before[k]); d > 0 {
			out[k] = d
		}
	}
	return out
}

// threadTool calls t3_thread once on each of the big machine's other threads (first calls), then
// ThreadCalls+1 times on its first thread (a first call, then the repeated ones), and reads the
// same thread straight from the fake for comparison.
func (h *harness) threadTool(ctx context.Context) error {
	tid, others := h.big.threads[0], h.big.threads[1:]
	call := func(thread string) (time.Duration, error) {
		_, t, err := h.agents.timedCall(ctx, 0, "t3_thread", map[string]any{"thread_id": thread})
		return t.end.Sub(t.start), err
	}
	tt := &ThreadTool{Items: 5 * ((h.cfg.BigThreadItems + 4) / 5)}
	if len(others) > 0 {
		if h.cfg.ThreadWarm {
			w, err := h.warmHeap(ctx)
			if err != nil {
				return err
			}
			tt.Warm = w
		}
		h.logf("t3_thread: first calls on %d threads of %d items", len(others), h.cfg.BigThreadItems)
		src0 := h.threadSources(ctx)
		u, pc := h.mark(), startPreciseCPU(h.conn.pid)
		var first []time.Duration
		for _, other := range others {
			d, err := call(other)
			if err != nil {
				return err
			}
			first = append(first, d)
		}
		// What the calls left running (a t3_thread feed's subscription decoding its snapshot)
		// is theirs too: counted before the repeated calls begin.
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
		fu := h.usageSince(u)
		tt.FirstLatency, tt.FirstCPUPerCall = dist(first), pc.of(fu.CPU)/time.Duration(len(others))
		tt.FirstSysPerCall = fu.SysCPU / time.Duration(len(others))
		tt.FirstFaultsPerCall = float64(fu.MinorFaults) / float64(len(others))
		tt.FirstSources = sourcesSince(src0, h.threadSources(ctx))
	}
	h.logf("t3_thread on a %d-item thread × %d", h.cfg.BigThreadItems, h.cfg.ThreadCalls)
	src0 := h.threadSources(ctx) // outside the CPU windows: a scrape costs the connector CPU
	u := h.mark()
	if _, err := call(tid); err != nil {
		return err
	}
	ru, rpc := h.mark(), startPreciseCPU(h.conn.pid)
	var lat []time.Duration
	for range h.cfg.ThreadCalls {
		d, err := call(tid)
		if err != nil {
			return err
		}
		lat = append(lat, d)
	}
	if h.cfg.ThreadCalls > 0 {
		tt.RepeatCPUPerCall = rpc.of(h.usageSince(ru).CPU) / time.Duration(h.cfg.ThreadCalls)
	}
	usage := h.usageSince(u)
	tt.Sources = sourcesSince(src0, h.threadSources(ctx))
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
	tt.Bytes, tt.BoundedBytes, tt.Latency, tt.Direct, tt.Usage = size, bounded, dist(lat), dist(direct), usage
	tt.CPUPerCall = usage.CPU / time.Duration(h.cfg.ThreadCalls+1)
	h.rep.ThreadTool = tt
	h.logf("t3_thread: %s; the fake's GET alone: %s", h.rep.ThreadTool.Latency, h.rep.ThreadTool.Direct)
	return nil
}

// The warm-up's bounds: it stops once the connector has settled, or at these.
const (
	warmMaxCalls = 10000
	warmMaxWall  = time.Minute
	warmBatch    = 25 // calls between two looks at the connector
)

// warmHeap calls t3_thread on a small thread until the connector's heap has settled: it has
// collected garbage since the warm-up began and a batch of warmBatch calls made fewer minor page
// faults than calls; at most warmMaxCalls calls or warmMaxWall. Why: once the machines'
// snapshots are in, the connector returns its free memory to the OS (internal/watch/gate.go),
// and the Go runtime hands out free pages lowest address first, whether it has returned them or
// not; so for a while after start-up most pages a call allocates are new to the kernel, a minor
// fault each. One collection does not end that (measured: ~35–48 faults per first call after
// one, as before it); some thousands of calls and several collections later the heap's pages
// are in use again and a first call makes 1–2 (docs/benchmarks.md, "The first call's kernel
// time: page faults"). The thread is the first machine's last one: t3_thread only reads, so
// sharing it with a later phase's role changes nothing in T3.
func (h *harness) warmHeap(ctx context.Context) (*ThreadWarm, error) {
	const gcCount = "go_gc_duration_seconds_count"
	tid := h.machines[0].threads[len(h.machines[0].threads)-1]
	gc0, err := h.conn.metric(ctx, gcCount)
	if err != nil {
		return nil, fmt.Errorf("thread warm-up: the connector's collections: %w", err)
	}
	h.logf("t3_thread: warm-up on %s until the connector's heap has settled", tid)
	w, t0 := &ThreadWarm{}, time.Now()
	first, _ := h.conn.times()
	last, settled := first, false
	for !settled && w.Calls < warmMaxCalls && time.Since(t0) < warmMaxWall {
		b0, _ := h.conn.times() // after the last look's scrape: its faults are not the calls'
		for range warmBatch {
			if _, _, err := h.agents.timedCall(ctx, 0, "t3_thread", map[string]any{"thread_id": tid}); err != nil {
				return nil, fmt.Errorf("thread warm-up: %w", err)
			}
			w.Calls++
		}
		b1, _ := h.conn.times()
		last = b1
		gc, err := h.conn.metric(ctx, gcCount)
		if err != nil {
			return nil, fmt.Errorf("thread warm-up: the connector's collections: %w", err)
		}
		w.GCCycles = int64(gc - gc0)
		settled = w.GCCycles > 0 && b1.minflt-b0.minflt < warmBatch
	}
	w.Wall, w.MinorFaults, w.Settled = time.Since(t0), last.minflt-first.minflt, settled
	if !settled {
		h.warn("thread warm-up: the connector's heap had not settled after %d calls (%s, %d collections): the first calls are measured on pages still new to the kernel", w.Calls, w.Wall.Round(time.Millisecond), w.GCCycles)
	}
	return w, nil
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
	if rep.ActiveWaits, err = h.awaitBlocked(ctx, len(waitRuns)); err != nil {
		return err
	}
	h.logf("latency phase: %d waits blocked; %.0f runs/s for %s", rep.ActiveWaits, cfg.Rate, cfg.Duration)

	first := h.settledCount()
	hist0 := h.stagesMark(ctx)
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
	h.warnMonitor("latency", rep.Usage)
	if err := h.idle(ctx); err != nil {
		return err
	}
	got, err := collectWakes(ctx, wakes, len(waitRuns), cfg.Drain)
	if err != nil {
		return err
	}
	wcancel()
	runs := h.settledSince(first)
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"latency", runs})
	h.drainEvents(ctx, runs)
	rep.Stages = h.stagesSince(ctx, hist0)
	lat, rx, missing := h.eventLatencies(runs)
	rep.Events, rep.EventsRx, rep.MissingEvent = dist(lat), dist(rx), missing
	h.wakeLatencies(rep, waitRuns, got)
	ps, err := h.pipelineStats(ctx)
	rep.Skipped, rep.Behind = ps.skipped, ps.behind
	h.logf("latency phase: events %s; wakes %s", rep.Events, rep.Wake)
	return err
}

// awaitBlocked waits (60 s at most) until the connector reports n t3_wait calls blocked, and
// returns how many it last reported.
func (h *harness) awaitBlocked(ctx context.Context, n int) (int, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		active, err := h.conn.metric(ctx, "t3code_mcp_active_waits")
		if err != nil {
			return 0, err
		}
		if int(active) >= n {
			return int(active), nil
		}
		if time.Now().After(deadline) {
			h.warn("only %d of %d t3_wait calls were blocked after 60 s", int(active), n)
			return int(active), nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return int(active), err
		}
	}
}

// collectWakes takes up to n wait results, for at most drain.
func collectWakes(ctx context.Context, wakes <-chan wake, n int, drain time.Duration) ([]wake, error) {
	var got []wake
	timeout := time.After(drain)
	for len(got) < n {
		select {
		case w := <-wakes:
			got = append(got, w)
		case <-timeout:
			return got, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return got, nil
}

// wakeLatencies reports how soon after each wait's run was released its t3_wait returned; a
// wait that failed or never returned counts as a missing wake. The clock starts at the first
// frame that showed the run settled: its shell row, or its thread's own stream (a wait is woken
// by whichever the connector sees first, and the thread stream's frame can leave before the
// shell's, which waits for the previous chunk's Ack).
func (h *harness) wakeLatencies(rep *Latency, waitRuns []*run, got []wake) {
	sent := h.firstSendTimes(waitRuns)
	var wl, rx []time.Duration
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
		if !w.rx.IsZero() {
			rx = append(rx, w.rx.Sub(s))
		}
	}
	rep.MissingWake += len(waitRuns) - len(got)
	rep.Wake, rep.WakeRx = dist(wl), dist(rx)
}
