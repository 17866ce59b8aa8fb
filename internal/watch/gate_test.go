package watch

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-faster/jx"
)

// TestGateBoundsAndFreesOnce runs 20 snapshot-sized chunks through a gate of 3 places: never
// more than 3 at once, and memory is freed once the gate has gone quiet, not once per chunk (the
// quiet period is an hour here and its end is played by calling fire: no timing in the test).
func TestGateBoundsAndFreesOnce(t *testing.T) {
	freed := make(chan struct{}, 20)
	g := newGate(3, time.Hour, func() { freed <- struct{}{} })
	big := []jx.Raw{bigSnapshot()}
	var in, most atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &pass{g: g}
			defer p.release()
			if i%2 == 0 { // a new watcher: holds the place from its subscription
				if err := p.hold(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
			<-start
			err := p.chunk(context.Background(), big, func() error {
				n := in.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Millisecond) // let others pile up at the gate
				in.Add(-1)
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if m := most.Load(); m > 3 || m < 1 {
		t.Errorf("%d chunks at once through a gate of 3", m)
	}
	if len(freed) != 0 {
		t.Fatal("memory freed while chunks went through")
	}
	g.fire() // the quiet period ends
	g.fire() // nothing went through since: nothing to free
	// Small chunks and big chunks of other items do not go through the gate and free nothing.
	p := &pass{g: g}
	bigItems := jx.Raw(`{"kind":"thread.updated","sequence":9,"thread":{"title":"` + strings.Repeat("x", bigChunk) + `"}}`)
	for _, c := range [][]jx.Raw{{jx.Raw(`{"kind":"snapshot","snapshot":{}}`)}, {bigItems, bigItems}} {
		if err := p.chunk(context.Background(), c, func() error {
			if len(g.sem) != 0 {
				t.Error("an ordinary chunk went through the gate")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	busy, frees := g.busy, g.frees
	if g.timer != nil {
		g.timer.Stop()
	}
	g.mu.Unlock()
	if busy != 0 || frees != 1 || len(freed) != 1 {
		t.Errorf("after the storm: busy %d, freed %d times (%d calls), want 0, 1 and 1", busy, frees, len(freed))
	}
}

// bigSnapshot is a snapshot item past bigChunk, its kind written last (the scan must find it).
func bigSnapshot() jx.Raw {
	return jx.Raw(`{"snapshot":{"threads":[],"pad":"` + strings.Repeat("x", bigChunk) + `"},"kind":"snapshot"}`)
}

// TestGateEnterCancelled leaves no place taken when the wait is cancelled.
func TestGateEnterCancelled(t *testing.T) {
	g := newGate(1, time.Hour, func() {})
	p := &pass{g: g}
	if err := p.hold(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (&pass{g: g}).hold(ctx); err == nil {
		t.Fatal("hold on a full gate with a cancelled context succeeded")
	}
	p.release()
	p.release() // twice is fine
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy != 0 || len(g.sem) != 0 {
		t.Errorf("busy %d, places taken %d", g.busy, len(g.sem))
	}
	g.timer.Stop()
}
