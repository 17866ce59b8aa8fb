package loadtest

import (
	"context"
	"fmt"
	"time"
)

// This file: the throughput phase: runs settled per second at the offered rate.

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
	hist0 := h.stagesMark(ctx)
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
	if settled > 0 {
		rep.HarnessPerRun = rep.Usage.HarnessCPU / time.Duration(settled)
	}
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
	// Drained: nothing pending in the outbox (shared by the replicas) and no watched thread
	// waiting for a look-up on any replica (each looks up the machines whose lease it holds; an
	// event still to be looked up is not in the outbox yet).
	drainStart := time.Now()
	for time.Since(drainStart) < cfg.Drain && !cfg.NoHook {
		pending, lookups, err := h.backlog(ctx)
		if err != nil {
			h.warn("throughput phase: /healthz while draining: %v", err)
			break
		}
		rep.Left = pending
		if pending == 0 && lookups == 0 {
			rep.Drained = time.Since(drainStart)
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	rep.Stages = h.stagesSince(ctx, hist0)
	runs := h.settledSince(first)
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"throughput", runs})
	lat, _, missing := h.eventLatencies(runs)
	rep.Events = dist(lat)
	if missing > 0 && rep.Left == 0 {
		h.warn("throughput phase: %d settled runs have no webhook", missing)
	}
	return nil
}

// backlog is what is left to deliver: the outbox's pending events (one count, whichever replica
// answers) and the watched threads awaiting a look-up, summed over every replica.
func (h *harness) backlog(ctx context.Context) (pending, lookups int, err error) {
	for i, c := range append([]*connector{h.conn}, h.extra...) {
		hb, err := c.health(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("replica %d: %w", i+1, err)
		}
		if i == 0 {
			pending = hb.Events.Pending
		}
		lookups += hb.Events.Lookups
	}
	return pending, lookups, nil
}
