package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// groupQueue is the store with its Record going through the group committer, as the app wires it
// (app.groupRecords): the deliveries' records ride in the committers' transactions.
type groupQueue struct {
	*store.Bolt
	g *store.Group
}

func (q groupQueue) Record(ops []store.Op) ([]error, error) { return q.g.Record(ops) }

// BenchmarkDeliverWhileCommitting measures delivery while commits run: 100 committers (the
// machines' watchers) commit one event each (with its thread row and detector state, as the
// detector does) every 20 ms through the group committer of the same bbolt file — 5,000
// events/s offered — while the outbox delivers to a local receiver that answers 204 at once and
// records its outcomes through the same group committer. One op is a window of 20,000 commits;
// delivered/committed is the share of the window's commits delivered within the window (the
// throughput phase's "delivered ≥ 95 % of committed"). The backlog left is drained, untimed,
// before the next op.
//
// The outbox is wired as the app wires it with bbolt: the group commit hands every event it made
// durable to the outbox (Group.OnDurable → Committed, Config.HandOver), and the committers do not
// Notify. cpu-µs/event is the process's CPU (user + system: committers, outbox, receiver) per
// event committed in the window, allocs/event its allocations.
func BenchmarkDeliverWhileCommitting(b *testing.B) { benchDeliverWhileCommitting(b, 0, true) }

// BenchmarkDeliverWhileCommittingReadBack: the same without the hand-over (as before it, and as
// with a store that cannot hand over): the committers Notify, the outbox scans the store for the
// new events and reads each one back before sending it.
func BenchmarkDeliverWhileCommittingReadBack(b *testing.B) { benchDeliverWhileCommitting(b, 0, false) }

// BenchmarkDeliverWhileCommittingSlowReceiver: the same with a receiver that answers 10 ms after
// each request (a round trip to a receiver on a busy host, as the load harness's is while the
// connector commits 5,000 events/s on the same 2 cores): requests in flight × round trip bound
// the rate.
func BenchmarkDeliverWhileCommittingSlowReceiver(b *testing.B) {
	benchDeliverWhileCommitting(b, 10*time.Millisecond, true)
}

func benchDeliverWhileCommitting(b *testing.B, rtt time.Duration, handOver bool) {
	const (
		machines = 100
		threads  = 1000
		window   = 20000
		period   = 20 * time.Millisecond
	)
	srv, got := countingReceiver(b, rtt)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	body := []byte(`{"id":"evt","type":"thread.completed","machine":"load-007","thread_id":"thread-1","summary":"Done: fix the flaky test"}`)
	state := make([]byte, 200)

	st, err := store.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	g := store.NewGroup(st)
	ob, err := outbox.New(groupQueue{st, g}, outbox.Config{URL: srv.URL, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", Logger: quiet, HandOver: handOver})
	if err != nil {
		b.Fatal(err)
	}
	notify := ob.Notify
	if handOver {
		if !g.OnDurable(ob.Committed) {
			b.Fatal("no hand-over from the bbolt group")
		}
		notify = func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ob.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var committed, inWindow int64
	var busy, cpu time.Duration
	var mallocs uint64
	next := 0 // event ids go on across ops
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start, cpu0, mallocs0 := time.Now(), processCPU(b), heapMallocs()
		base := got.Load()
		var left atomic.Int64
		left.Store(window)
		var wg sync.WaitGroup
		for m := range machines {
			wg.Add(1)
			go func(m int) {
				defer wg.Done()
				tick := time.NewTicker(period)
				defer tick.Stop()
				for n := 0; left.Add(-1) >= 0; n++ {
					th := "thread-" + strconv.Itoa(rand.IntN(threads))
					id := "evt_" + strconv.Itoa(next) + "_" + strconv.Itoa(m) + "_" + strconv.Itoa(n)
					err := g.Commit(store.Batch{
						Events:   []store.Event{{ID: id, Stream: "m" + strconv.Itoa(m) + "/" + th, Body: body, CreatedAt: time.Now()}},
						Threads:  []store.Thread{{ID: th, Machine: "m" + strconv.Itoa(m), Watch: true, Title: "a thread title of some length", UpdatedAt: time.Now()}},
						Detector: map[string][]byte{"m" + strconv.Itoa(m) + "/" + th: state},
					})
					if err != nil {
						b.Error(err)
						return
					}
					notify()
					<-tick.C
				}
			}(m)
		}
		wg.Wait()
		busy += time.Since(start)
		cpu += processCPU(b) - cpu0
		mallocs += heapMallocs() - mallocs0
		committed += window
		inWindow += got.Load() - base
		next++
		b.StopTimer()
		for {
			if p, _, _, err := st.Counts(); err != nil || p == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(committed)/busy.Seconds(), "committed/s")
	b.ReportMetric(float64(inWindow)/busy.Seconds(), "delivered/s")
	b.ReportMetric(100*float64(inWindow)/float64(committed), "delivered%")
	b.ReportMetric(float64(cpu.Microseconds())/float64(committed), "cpu-µs/event")
	b.ReportMetric(float64(mallocs)/float64(committed), "allocs/event")
}

// processCPU is the CPU time (user and system) the process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapMallocs is the number of heap allocations so far.
func heapMallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}
