package loadtest

import (
	"context"
	"time"
)

// This file: the latency phase: t3_thread reads and t3_wait wake-ups, and the event latency of
// the runs they settle.

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
	lat, missing := h.eventLatencies(runs)
	rep.Events, rep.MissingEvent = dist(lat), missing
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
// wait that failed or never returned counts as a missing wake.
func (h *harness) wakeLatencies(rep *Latency, waitRuns []*run, got []wake) {
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
}
