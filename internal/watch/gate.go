package watch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-faster/jx"
	"github.com/t3code-mcp/t3code-mcp/internal/memreturn"
)

// The snapshot gate bounds how many watchers of the process receive, decode and apply a shell
// snapshot at the same time. At start-up every machine sends one (0.85 MB of JSON and ~2.5 MB
// decoded for 1,000 threads); a hundred machines doing that at once held them all in memory
// together, and the Go heap kept the peak long after (docs/benchmarks.md: 171 MB idle, not
// returned). Through the gate a few at a time go through, and once it has been idle for a
// moment after such work, the garbage is returned to the OS (memreturn.Settle: debug.FreeOSMemory,
// then the process's warm reserve touched again) — once at the end of start-up, and again after a
// reconnect storm, not after every machine. (After other busy spells, internal/memreturn does it
// once the process has turned quiet.)
//
// The gate is one per process, not per Fleet: memory is the process's.
var snapshots = newGate(4, 500*time.Millisecond, memreturn.Settle)

// bigChunk is the size from which a snapshot goes through the gate even after start-up (T3 answers
// a resubscription with a snapshot when the gap is too large). Other chunks never do: a lagging
// connector gets big chunks of ordinary items, and gating those would cap how many machines'
// chunks are committed together.
const bigChunk = 64 << 10

type gate struct {
	sem   chan struct{}
	quiet time.Duration
	free  func()

	mu    sync.Mutex
	busy  int  // holders and waiters
	dirty bool // work went through since the last free
	timer *time.Timer
	frees int // how many times free ran (tests)
}

func newGate(n int, quiet time.Duration, free func()) *gate {
	return &gate{sem: make(chan struct{}, n), quiet: quiet, free: free}
}

// enter waits for a place; leave must follow a nil error.
func (g *gate) enter(ctx context.Context) error {
	g.mu.Lock()
	g.busy++
	g.mu.Unlock()
	select {
	case g.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		g.busy--
		g.mu.Unlock()
		return ctx.Err()
	}
}

func (g *gate) leave() {
	<-g.sem
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy--
	g.dirty = true
	if g.busy > 0 {
		return
	}
	if g.timer == nil {
		g.timer = time.AfterFunc(g.quiet, g.fire)
	} else {
		g.timer.Reset(g.quiet)
	}
}

// fire frees memory if nothing went through the gate since it was armed.
func (g *gate) fire() {
	g.mu.Lock()
	if g.busy > 0 || !g.dirty {
		g.mu.Unlock()
		return
	}
	g.dirty = false
	g.frees++
	g.mu.Unlock()
	g.free()
}

// pass is one session's use of the gate: held from the subscription until its first chunk is
// applied when a snapshot is expected (a watcher without state), and around any big chunk after.
type pass struct {
	g *gate

	mu    sync.Mutex
	held  bool
	timer *time.Timer
}

// firstChunkLimit gives the place back when a machine does not answer its subscription: one slow
// machine must not keep the others waiting for long.
const firstChunkLimit = 30 * time.Second

// hold enters the gate for the subscription's first chunk.
func (p *pass) hold(ctx context.Context) error {
	if err := p.g.enter(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	p.held = true
	p.timer = time.AfterFunc(firstChunkLimit, p.release)
	p.mu.Unlock()
	return nil
}

// release gives back the first-chunk place, if held; it is safe to call more than once.
func (p *pass) release() {
	p.mu.Lock()
	held := p.held
	p.held = false
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	if held {
		p.g.leave()
	}
}

func (p *pass) holding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// chunk runs apply for one chunk: under the first-chunk place when held (and gives it back
// after), else through the gate when the chunk holds a big snapshot.
func (p *pass) chunk(ctx context.Context, values []jx.Raw, apply func() error) error {
	if p.holding() {
		defer p.release()
		return apply()
	}
	if !hasSnapshot(values) {
		return apply()
	}
	if err := p.g.enter(ctx); err != nil {
		return err
	}
	defer p.g.leave()
	return apply()
}

// errKnown stops a scan once the item's kind is known.
var errKnown = errors.New("kind known")

// hasSnapshot reports whether one of values is a big shell snapshot item. It reads only up to
// each big item's "kind" (T3 and the fake write it first; otherwise the item is scanned, not
// decoded).
func hasSnapshot(values []jx.Raw) bool {
	for _, v := range values {
		if len(v) < bigChunk {
			continue
		}
		snapshot := false
		_ = jx.DecodeBytes(v).ObjBytes(func(d *jx.Decoder, k []byte) error {
			if string(k) != "kind" {
				return d.Skip()
			}
			kind, err := d.Str()
			snapshot = err == nil && kind == "snapshot"
			return errKnown
		})
		if snapshot {
			return true
		}
	}
	return false
}
