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
