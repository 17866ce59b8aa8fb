package loadtest

import (
	"context"
	"time"
)

// outage takes the webhook receiver down (it answers 503) for cfg.Outage while runs settle at
// cfg.OutageRate on cfg.OutageThreads threads of each machine, waits until the outbox holds every
// one of their events, brings the receiver back and measures the drain: how long until every
// event of the phase has arrived, whether each thread's events arrived in the order its runs
// settled, and how many never arrived within cfg.OutageDrain.
func (h *harness) outage(ctx context.Context) error {
	cfg := h.cfg
	if cfg.NoHook {
		h.warn("outage phase skipped: events are off (-no-hook)")
		return nil
	}
	threads := 0
	for _, m := range h.machines {
		threads += min(cfg.OutageThreads, len(m.pipe.threads))
	}
	rep := &Outage{Down: cfg.Outage, Offered: cfg.OutageRate, Threads: threads}
	h.rep.Outage = rep
	if err := h.idle(ctx); err != nil {
		return err
	}
	// Earlier phases' runs recorded during the outage would swell its backlog unnoticed: start
	// once the connector has taken in everything T3 sent.
	if err := h.applied(ctx, 2*time.Minute); err != nil {
		h.warn("outage phase: starting while the connector is still behind: %v", err)
	}
	hb, err := h.conn.health(ctx)
	if err != nil {
		return err
	}
	rep.PendingBefore = hb.Events.Pending
	if rep.PendingBefore > 0 {
		h.warn("outage phase: %d events were still pending from earlier phases; they are part of the backlog", rep.PendingBefore)
	}

	h.logf("outage phase: receiver down for %s, %.0f runs/s on %d threads", cfg.Outage, cfg.OutageRate, threads)
	first := h.settledCount()
	h.setDown(true)
	refused0 := h.rec.refused.Load()
	u := h.mark()
	if err := h.setPipeline(ctx, cfg.OutageRate, 0, cfg.OutageThreads); err != nil {
		return err
	}
	if err := sleepCtx(ctx, cfg.Outage); err != nil {
		return err
	}
	if err := h.setPipeline(ctx, 0, 0, 0); err != nil {
		return err
	}
	if err := h.idle(ctx); err != nil {
		return err
	}
	runs := h.settledSince(first)
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"outage", runs})
	rep.Settled = len(runs)
	ps, err := h.pipelineStats(ctx)
	if err != nil {
		return err
	}
	if ps.behind+ps.skipped > 0 {
		h.warn("outage phase: %d offered runs not started (harness behind %d, no idle thread %d)", ps.behind+ps.skipped, ps.behind, ps.skipped)
	}

	// The receiver comes back only once every settled run's event is in the outbox, so that the
	// drain measures the backlog and not the connector catching up with T3.
	endDown := time.Now()
	if rep.Backlog, err = h.awaitBacklog(ctx, rep.PendingBefore+rep.Settled, rep.Settled); err != nil {
		return err
	}
	rep.CommitWait = time.Since(endDown)
	rep.Refused = h.rec.refused.Load() - refused0
	rep.DownUsage = h.usageSince(u)

	if cfg.AtBacklog != nil {
		cfg.AtBacklog()
	}
	h.logf("outage phase: backlog %d; receiver back", rep.Backlog)
	u = h.mark()
	back := time.Now()
	h.setDown(false)
	if err := h.awaitDrain(ctx, rep, runs, back); err != nil {
		return err
	}
	rep.DrainUsage = h.usageSince(u)
	if rep.Drained > 0 {
		rep.DrainRate = float64(rep.Backlog) / rep.Drained.Seconds()
	}
	rep.OrderChecked, rep.OrderBroken = h.checkOrder(runs)
	h.logf("outage phase: %d of %d delivered, drained in %s, order broken on %d of %d threads",
		rep.Delivered, rep.Settled, ms(rep.Drained), rep.OrderBroken, rep.OrderChecked)
	return nil
}

// awaitBacklog waits (at least a minute, or Drain) until the outbox holds want pending events,
// and returns how many it last held.
func (h *harness) awaitBacklog(ctx context.Context, want, settled int) (int, error) {
	start := time.Now()
	limit := start.Add(max(time.Minute, h.cfg.Drain))
	for {
		hb, err := h.conn.health(ctx)
		if err != nil {
			return 0, err
		}
		if hb.Events.Pending >= want {
			return hb.Events.Pending, nil
		}
		if time.Now().After(limit) {
			h.warn("outage phase: the outbox held %d events %s after the outage, %d runs settled", hb.Events.Pending, time.Since(start).Round(time.Second), settled)
			return hb.Events.Pending, nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return hb.Events.Pending, err
		}
	}
}

// awaitDrain waits (OutageDrain at most) until every run's event has arrived since back, the
// receiver's return, and reports how many did and how long the last one took.
func (h *harness) awaitDrain(ctx context.Context, rep *Outage, runs []*run, back time.Time) error {
	deadline := back.Add(h.cfg.OutageDrain)
	for {
		missing := 0
		var last time.Time
		for _, r := range runs {
			d, ok := h.rec.forRun(r.id)
			if !ok {
				missing++
				continue
			}
			if d.at.After(last) {
				last = d.at
			}
		}
		rep.Delivered, rep.Undelivered = len(runs)-missing, missing
		if missing == 0 {
			rep.Drained = max(last.Sub(back), time.Nanosecond)
			return nil
		}
		if time.Now().After(deadline) {
			return nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// checkOrder compares, for every thread with two or more events received, the order in which its
// runs' events arrived with the order in which the runs settled (a thread runs one at a time).
func (h *harness) checkOrder(runs []*run) (checked, broken int) {
	settled := map[string][]string{} // thread → run ids in settling order
	for _, r := range runs {
		settled[r.thread] = append(settled[r.thread], r.id)
	}
	for thread, want := range settled {
		pos := make(map[string]int, len(want))
		for i, id := range want {
			pos[id] = i
		}
		var got []int
		for _, id := range h.rec.arrivals(thread) {
			if i, ok := pos[id]; ok {
				got = append(got, i)
			}
		}
		if len(got) < 2 {
			continue
		}
		checked++
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				if broken++; broken <= 3 {
					h.warn("outage phase: thread %s: events arrived for runs %v, settled as %v", thread, h.rec.arrivals(thread), want)
				}
				break
			}
		}
	}
	return checked, broken
}

// setDown turns the webhook receiver down (503 to every delivery) or up again, in the split
// child if there is one.
func (h *harness) setDown(down bool) {
	if h.clients != nil {
		if err := h.clients.setDown(down); err != nil {
			h.warn("receiver down=%v: %v", down, err)
		}
		return
	}
	h.rec.down.Store(down)
}
