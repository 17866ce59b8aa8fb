package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// This file: the comparison phase: the connector's waits against clients polling T3 themselves.

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
	pollOut := make([]chan polled, len(polls))
	for i, runs := range polls {
		pollOut[i] = make(chan polled, len(runs))
		iv := cfg.Pollers[i].Interval
		for _, r := range runs {
			go func() {
				at, n, err := poll(phaseCtx, r, iv)
				pollOut[i] <- polled{r, at, n, err}
			}()
		}
	}
	if err := h.releaseWithin(ctx, start, slices.Concat(append([][]*run{push}, polls...)...)); err != nil {
		return err
	}

	waitA, hookA := h.pushNotices(phaseCtx, push, wakes)
	pollA, pollRequests := pollNotices(cfg.Pollers, polls, pollOut)
	if err := h.idle(ctx); err != nil {
		return err
	}
	// What the connector asked T3 for: every HTTP request the fakes served in the phase, less
	// the pollers' own.
	total, byRoute := h.requestsSince(before, pollRequests)
	waitA.Requests, waitA.ByRoute = total, byRoute
	waitA.PerRun = float64(total) / float64(max(1, len(push)))
	hookA.Requests, hookA.PerRun, hookA.ByRoute = waitA.Requests, waitA.PerRun, byRoute

	h.rep.Compare = []Approach{waitA}
	if !cfg.NoHook {
		h.rep.Compare = append(h.rep.Compare, hookA)
	}
	h.rep.Compare = append(h.rep.Compare, pollA...)
	for i := range h.rep.Compare {
		a := &h.rep.Compare[i]
		if waitA.Notice.Mean > 0 {
			a.NoticeRatio = float64(a.Notice.Mean) / float64(waitA.Notice.Mean)
		}
		if waitA.PerRun > 0 {
			a.RequestX = a.PerRun / waitA.PerRun
		}
		h.logf("comparison: %s: %s, %.2f requests/run", a.Name, a.Notice, a.PerRun)
	}
	return nil
}

// polled is how one poller's run ended: when it noticed the run settled, after how many requests.
type polled struct {
	r   *run
	at  time.Time
	req int64
	err error
}

// releaseWithin releases the runs at random times (a fixed seed) within RunLength of start.
func (h *harness) releaseWithin(ctx context.Context, start time.Time, all []*run) error {
	rng := rand.New(rand.NewPCG(1, 2))
	offsets := make([]time.Duration, len(all))
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(h.cfg.RunLength)) + 1)
	}
	return h.release(ctx, all, func(i int) time.Time { return start.Add(offsets[i]) })
}

// pushNotices measures the push path: how soon after each run settled its t3_wait returned
// and its webhook arrived.
func (h *harness) pushNotices(ctx context.Context, push []*run, wakes <-chan wake) (waitA, hookA Approach) {
	waitA = Approach{Name: "connector t3_wait (push)", Runs: len(push)}
	hookA = Approach{Name: "connector webhook (push)", Runs: len(push)}
	var wl, hl []time.Duration
	for range push {
		var w wake
		select {
		case w = <-wakes:
		case <-ctx.Done():
		}
		if w.r == nil || w.err != nil || !settledBy(ctx, w.r) {
			continue
		}
		waitA.Noticed++
		wl = append(wl, w.at.Sub(w.r.settleAt))
	}
	h.phaseRuns = append(h.phaseRuns, phaseRuns{"compare (push)", push})
	h.drainEvents(ctx, push)
	for _, r := range push {
		if d, ok := h.rec.forRun(r.id); ok && isSettled(r) {
			hookA.Noticed++
			hl = append(hl, d.at.Sub(r.settleAt))
		}
	}
	waitA.Notice, hookA.Notice = dist(wl), dist(hl)
	return waitA, hookA
}

// pollNotices measures each poller: how soon it noticed its runs settle and how many requests
// that took; requests is the pollers' requests together.
func pollNotices(pollers []Poller, polls [][]*run, out []chan polled) (approaches []Approach, requests int64) {
	for i, runs := range polls {
		a := Approach{Name: fmt.Sprintf("HTTP poller every %s", pollers[i].Interval), Runs: len(runs)}
		var pl []time.Duration
		for range runs {
			n := <-out[i]
			a.Requests += n.req
			if n.err == nil {
				<-n.r.settled // the poller saw it settle in T3: the driver records it right after its Step
				a.Noticed++
				pl = append(pl, n.at.Sub(n.r.settleAt))
			}
		}
		requests += a.Requests
		a.Notice = dist(pl)
		a.PerRun = float64(a.Requests) / float64(max(1, a.Noticed))
		a.ByRoute = map[string]int64{routeThread: a.Requests}
		approaches = append(approaches, a)
	}
	return approaches, requests
}

// requestsSince is what the fakes served since before, by route and in all, less the pollers'
// own requests.
func (h *harness) requestsSince(before map[string]int64, pollRequests int64) (total int64, byRoute map[string]int64) {
	byRoute = map[string]int64{}
	for k, v := range h.requests() {
		if d := v - before[k]; d > 0 {
			byRoute[k] = d
			total += d
		}
	}
	byRoute[routeThread] -= pollRequests
	if byRoute[routeThread] == 0 {
		delete(byRoute, routeThread)
	}
	return total - pollRequests, byRoute
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

// settledBy waits until the driver has recorded r's settling (settleAt), which a t3_wait can
// report before the driver's Step has returned; false if ctx ends first.
func settledBy(ctx context.Context, r *run) bool {
	select {
	case <-r.settled:
		return true
	case <-ctx.Done():
		return false
	}
}

// isSettled says whether the driver has recorded r's settling.
func isSettled(r *run) bool {
	select {
	case <-r.settled:
		return true
	default:
		return false
	}
}
