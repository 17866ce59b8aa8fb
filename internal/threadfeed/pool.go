package threadfeed

import (
	"context"
	"sync"
	"time"
)

// Pool holds the open feeds: one per thread, shared by every waiter on it and
// by the pool's own lingering hold (Linger), closed when the last one
// releases it; at most max at once (each is a subscription on T3 and a
// projection in memory), beyond which a waiter gets none and its result
// reads the thread as before.
//
// Lingering feeds are the t3_thread cache: a thread read recently keeps its
// feed open for lingerIdle after its last use, so that the next t3_thread
// renders from memory instead of reading the thread from T3. At most
// lingerMax feeds linger (the least recently used one is let go for a new
// one), and a lingering feed that no wait holds gives its place to a wait
// when the pool is full: waits come first.
type Pool struct {
	max   int
	mu    sync.Mutex
	feeds map[key]*Feed
	wg    sync.WaitGroup

	lingerMax  int
	lingerIdle time.Duration
	// lingering holds the pool's own hold (one of its refs) on the lingering
	// feeds, by key, with their last use.
	lingering map[key]time.Time
	sweep     *time.Timer // ends the idle lingering feeds; nil when none is set
	closed    bool        // Close was called: nothing lingers any more
}

type key struct{ machine, thread string }

// NewPool makes a pool of at most max feeds (max ≤ 0: none, every result
// reads). No feed lingers until SetLinger.
func NewPool(max int) *Pool {
	return &Pool{max: max, feeds: map[key]*Feed{}, lingering: map[key]time.Time{}}
}

// SetLinger lets up to max feeds linger for idle after their last Linger
// (max ≤ 0 or idle ≤ 0: none). Call it before the pool is used.
func (p *Pool) SetLinger(max int, idle time.Duration) {
	if max <= 0 || idle <= 0 {
		max, idle = 0, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lingerMax, p.lingerIdle = max, idle
}

// Acquire returns the feed of thread on machine, starting one on the socket
// dial gives when none is open (or the open one failed), and the caller's
// release, to be called once when its wait is over. ok is false when the
// pool is full: no feed, nothing to release.
func (p *Pool) Acquire(machine, thread string, dial Dial) (f *Feed, release func(), ok bool) {
	if p == nil {
		return nil, nil, false
	}
	k := key{machine, thread}
	p.mu.Lock()
	defer p.mu.Unlock()
	f = p.openLocked(k, dial, nil)
	if f == nil {
		return nil, nil, false
	}
	f.refs++
	var once sync.Once
	return f, func() { once.Do(func() { p.release(k, f) }) }, true
}

// Linger returns the feed of thread on machine for a t3_thread call and keeps
// it open until lingerIdle after the last such call (or until it is let go
// for another, see Pool). When none is open it starts one from seed: the
// caller's own read of the thread (trimmed as a feed's snapshot is, to the
// newest keepRuns runs; Cursor its snapshotSequence), which the subscription
// goes on from (afterSequence: T3 replays the events since, no snapshot);
// with no seed it starts none. ok is false when there is no feed: none open
// and no seed, nothing may linger, or the pool is full. The feed returned
// may be behind: Current says whether it can answer now.
func (p *Pool) Linger(machine, thread string, dial Dial, seed *State) (f *Feed, ok bool) {
	if p == nil {
		return nil, false
	}
	k := key{machine, thread}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lingerMax <= 0 || p.closed {
		return nil, false
	}
	if _, held := p.lingering[k]; held {
		if f = p.feeds[k]; f.Err() == nil {
			p.lingering[k] = time.Now()
			if seed != nil {
				f.advance(*seed)
			}
			return f, true
		}
	}
	if f = p.feeds[k]; f == nil || f.Err() != nil {
		if seed == nil {
			return nil, false
		}
	}
	if _, held := p.lingering[k]; !held && len(p.lingering) >= p.lingerMax {
		p.letGoLocked(p.oldestLingeringLocked(false))
	}
	if f = p.openLocked(k, dial, seed); f == nil {
		return nil, false
	}
	if _, held := p.lingering[k]; !held {
		f.refs++
	}
	p.lingering[k] = time.Now()
	if seed != nil {
		f.advance(*seed) // a feed open before (a wait's) that is behind the read
	}
	if p.sweep == nil {
		p.sweep = time.AfterFunc(p.lingerIdle, p.sweepIdle)
	}
	return f, true
}

// openLocked returns the open feed of k, starting one on dial when none is
// open (or the open one failed) and there is room, from seed when not nil
// (Linger); nil when there is none.
func (p *Pool) openLocked(k key, dial Dial, seed *State) *Feed {
	f := p.feeds[k]
	if f != nil && f.Err() != nil {
		// Failed (its socket dropped, say): its waiters read; a new waiter
		// gets a new feed. The failed one leaves the pool now.
		p.dropLocked(k, f)
		f = nil
	}
	if f != nil {
		return f
	}
	if len(p.feeds) >= p.max {
		// A feed that only lingers makes room.
		p.letGoLocked(p.oldestLingeringLocked(true))
		if len(p.feeds) >= p.max {
			return nil
		}
	}
	f = newFeed(k.machine, k.thread)
	if seed != nil {
		f.seed(*seed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	p.feeds[k] = f
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f.run(ctx, dial)
	}()
	return f
}

// dropLocked takes a failed feed out of the pool, and out of the lingering
// ones with the pool's hold on it (its waiters still release theirs).
func (p *Pool) dropLocked(k key, f *Feed) {
	delete(p.feeds, k)
	if _, held := p.lingering[k]; held {
		delete(p.lingering, k)
		if f.refs--; f.refs == 0 {
			f.cancel()
		}
	}
}

// oldestLingeringLocked is the key of the lingering feed used least recently
// (only of one no wait holds, when alone); ok is false when there is none.
func (p *Pool) oldestLingeringLocked(alone bool) (oldest key, ok bool) {
	var at time.Time
	for k, used := range p.lingering {
		if alone && p.feeds[k].refs != 1 {
			continue
		}
		if !ok || used.Before(at) {
			oldest, at, ok = k, used, true
		}
	}
	return oldest, ok
}

// letGoLocked ends the pool's lingering hold on the feed of k (ok false:
// nothing).
func (p *Pool) letGoLocked(k key, ok bool) {
	if _, held := p.lingering[k]; !ok || !held {
		return
	}
	delete(p.lingering, k)
	p.releaseLocked(k, p.feeds[k])
}

// sweepIdle lets go of the feeds that lingered lingerIdle since their last
// use, and sets itself for the next one to come due.
func (p *Pool) sweepIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep = nil
	if p.closed {
		return
	}
	now := time.Now()
	next := time.Duration(0)
	for k, used := range p.lingering {
		if left := used.Add(p.lingerIdle).Sub(now); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		p.letGoLocked(k, true)
	}
	if next > 0 {
		p.sweep = time.AfterFunc(next, p.sweepIdle)
	}
}

// release ends one waiter's share of f; the last one closes its stream (an
// Interrupt to T3) and takes it out of the pool.
func (p *Pool) release(k key, f *Feed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(k, f)
}

func (p *Pool) releaseLocked(k key, f *Feed) {
	if f.refs--; f.refs > 0 {
		return
	}
	if p.feeds[k] == f {
		delete(p.feeds, k)
	}
	f.cancel()
}

// Open counts the feeds open now (the t3code_mcp_wait_feeds gauge).
func (p *Pool) Open() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.feeds)
}

// Lingering counts the feeds kept open for t3_thread now (the
// t3code_mcp_thread_feeds gauge), whether or not a wait holds them too.
func (p *Pool) Lingering() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lingering)
}

// Close lets go of every lingering feed and lets none linger from now on
// (shutdown); the waits' feeds close as their waits end. Wait then waits for
// their streams.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.sweep != nil {
		p.sweep.Stop()
		p.sweep = nil
	}
	for k := range p.lingering {
		p.letGoLocked(k, true)
	}
}

// Wait blocks until every released feed's stream has ended (shutdown, tests).
func (p *Pool) Wait() {
	if p != nil {
		p.wg.Wait()
	}
}
