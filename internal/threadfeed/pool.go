package threadfeed

import (
	"context"
	"sync"
)

// Pool holds the open feeds: one per waited thread, shared by every waiter
// on it, closed when the last one releases it; at most max at once (each is
// a subscription on T3 and a projection in memory), beyond which a waiter
// gets none and its result reads the thread as before.
type Pool struct {
	max   int
	mu    sync.Mutex
	feeds map[key]*Feed
	wg    sync.WaitGroup
}

type key struct{ machine, thread string }

// NewPool makes a pool of at most max feeds (max ≤ 0: none, every result
// reads).
func NewPool(max int) *Pool {
	return &Pool{max: max, feeds: map[key]*Feed{}}
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
	f = p.feeds[k]
	if f != nil && f.Err() != nil {
		// Failed (its socket dropped, say): its waiters read; a new waiter
		// gets a new feed. The failed one leaves the pool now.
		delete(p.feeds, k)
		f = nil
	}
	if f == nil {
		if len(p.feeds) >= p.max {
			return nil, nil, false
		}
		f = newFeed(machine, thread)
		ctx, cancel := context.WithCancel(context.Background())
		f.cancel = cancel
		p.feeds[k] = f
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			f.run(ctx, dial)
		}()
	}
	f.refs++
	var once sync.Once
	return f, func() { once.Do(func() { p.release(k, f) }) }, true
}

// release ends one waiter's share of f; the last one closes its stream (an
// Interrupt to T3) and takes it out of the pool.
func (p *Pool) release(k key, f *Feed) {
	p.mu.Lock()
	defer p.mu.Unlock()
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

// Wait blocks until every released feed's stream has ended (shutdown, tests).
func (p *Pool) Wait() {
	if p != nil {
		p.wg.Wait()
	}
}
