package events

import (
	"context"
	"sync"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// The enrichment read, started early (Enricher.Prefetch). An event committed with only its facts
// (store.Event.Enrich: a failure, a question, an interrupted run) is completed from T3 before its
// first delivery. Read only after the commit, its latency was the commit's plus the read's; the
// detector now starts the read as soon as it has rendered the facts, before it queues the chunk's
// commit, and the outbox's Enrich takes the read's result (waiting for it if it is still under
// way) once the event is durable and handed over: the event goes out when it is durable AND
// complete, the longer of the two, not their sum.
//
// Nothing of it is on the Ack path or durable: Prefetch starts a goroutine and returns, and the
// chunk's Ack waits for its commit alone (a read that hangs holds nothing). The result lives in
// memory only, keyed by the event's id, until the outbox's Enrich takes it; after a crash the
// stored event still says Enrich and the outbox reads the thread itself, as before. A prefetch
// that failed is read again by Enrich (the outbox's retries and partial body apply as before); one
// never taken (the event was already stored, a fenced commit) is dropped after prefetchKeep.

const (
	// prefetchConcurrency bounds the prefetch reads in flight: past it an event is left to the
	// outbox's own read (as without prefetch).
	prefetchConcurrency = 32
	// prefetchLimit bounds the results held (taken or not): past it no prefetch starts.
	prefetchLimit = 4096
	// prefetchTimeout bounds one prefetch read.
	prefetchTimeout = 30 * time.Second
	// prefetchKeep is how long a result nobody took is kept.
	prefetchKeep = time.Minute
)

// prefetch is one enrichment read started before its event's commit.
type prefetch struct {
	done chan struct{} // closed when body/err are set
	body []byte
	err  error
	at   time.Time // when done
}

// prefetcher holds the reads started early; the zero value is stopped (Prefetch does nothing).
type prefetcher struct {
	mu        sync.Mutex
	ctx       context.Context // nil unless RunPrefetch runs
	m         map[string]*prefetch
	inflight  int
	lastSweep time.Time
	wg        sync.WaitGroup
	now       func() time.Time // nil: time.Now (tests set it before RunPrefetch)
}

func (p *prefetcher) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

// RunPrefetch lets Prefetch start reads until ctx ends, then waits for the reads in flight (they
// end with ctx) and drops every result. The app runs it beside the outbox.
func (en *Enricher) RunPrefetch(ctx context.Context) {
	p := &en.pre
	p.mu.Lock()
	p.ctx = ctx
	p.m = map[string]*prefetch{}
	p.mu.Unlock()
	<-ctx.Done()
	p.mu.Lock()
	p.ctx = nil
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	p.m = nil
	p.mu.Unlock()
}

// Prefetch starts the enrichment read of e (an event committed with Enrich) in the background and
// returns at once; Enrich takes its result. It does nothing when e needs no enrichment, when
// RunPrefetch is not running, or when too many reads are in flight or results held.
func (en *Enricher) Prefetch(e store.Event) {
	if !e.Enrich {
		return
	}
	p := &en.pre
	p.mu.Lock()
	if p.ctx == nil || p.inflight >= prefetchConcurrency {
		p.mu.Unlock()
		return
	}
	dropped := p.sweepLocked(p.clock())
	if _, dup := p.m[e.ID]; dup || len(p.m) >= prefetchLimit {
		p.mu.Unlock()
		en.m.prefetched(prefetchDropped, dropped)
		return
	}
	f := &prefetch{done: make(chan struct{})}
	p.m[e.ID] = f
	p.inflight++
	p.wg.Add(1)
	ctx := p.ctx
	p.mu.Unlock()
	en.m.prefetched(prefetchDropped, dropped)
	go func() {
		defer p.wg.Done()
		rctx, cancel := context.WithTimeout(ctx, prefetchTimeout)
		body, err := en.enrich(rctx, e)
		cancel()
		at := p.clock()
		p.mu.Lock()
		f.body, f.err, f.at = body, err, at
		p.inflight--
		p.mu.Unlock()
		close(f.done)
	}()
}

// take removes and returns e's prefetch, nil when none was started (or it was dropped).
func (p *prefetcher) take(id string) *prefetch {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.m[id]
	delete(p.m, id)
	return f
}

// sweepLocked drops the results nobody took within prefetchKeep (at most once per prefetchKeep)
// and reports how many.
func (p *prefetcher) sweepLocked(now time.Time) int {
	if now.Sub(p.lastSweep) < prefetchKeep {
		return 0
	}
	p.lastSweep = now
	n := 0
	for id, f := range p.m {
		if !f.at.IsZero() && now.Sub(f.at) >= prefetchKeep {
			delete(p.m, id)
			n++
		}
	}
	return n
}

// prefetched returns e's body as its prefetch read it, waiting for a read still under way, with
// outcome prefetchUsed; prefetchNone when there was none, prefetchFailed when it failed (the
// caller reads the thread itself then). err is ctx's when it ended while waiting.
func (p *prefetcher) prefetched(ctx context.Context, id string) (body []byte, outcome string, err error) {
	f := p.take(id)
	if f == nil {
		return nil, prefetchNone, nil
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	if f.err != nil {
		return nil, prefetchFailed, nil
	}
	return f.body, prefetchUsed, nil
}
