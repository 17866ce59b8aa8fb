package events_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// BenchmarkChunkDurableSteady is the Ack path of the load harness's latency phase at a light,
// steady rate: 100 machines, 1,000 watched threads each (the state file's size matters: every
// detector write dirties a page of a 100,000-key bucket), runs started at 1,000/s in all, each
// publishing the eight rows of T3's default script 5 ms apart (starting, running, four in-run
// changes, waiting with activeRunId cleared, completed), as the harness's fake does. Each machine is a watcher: T3 holds
// a stream's items until the Ack of the previous chunk, so a machine's next chunk is every row
// that arrived while its last one was applied and committed. One op is one run (one event).
//
// The outbox's part is there too: every event, once durable (Group.OnDurable), is recorded
// delivered through Group.Record every 10 ms, in the chunks' transactions.
//
// Reported: a settling row's time from T3 publishing it to its event being durable (event-p50/p99:
// T3's queue behind the previous chunk's Ack, the chunk's apply and its group commit), a chunk's
// own apply-to-durable time (chunk-p50/p99), the group's transactions and batches per run, the
// process's CPU per run (cpu-µs/run), and
// txs-taken/commit: the transactions the group took while a committing chunk waited (1 when it
// waited for one of its own, 0 when it joined the one being written).
func BenchmarkChunkDurableSteady(b *testing.B) { benchSteady(b, 10) }

// BenchmarkChunkDurableSteadySpread is BenchmarkChunkDurableSteady with runs on every watched
// thread in turn (as the load harness spreads them) instead of ten per machine: the detector's
// journal then holds a change of a different thread for every run, and its checkpoint passes run
// (after ~25,000 runs: the overlay's share of the 100,000 states) beside the chunks' commits.
func BenchmarkChunkDurableSteadySpread(b *testing.B) { benchSteady(b, 1000) }

// benchSteady is BenchmarkChunkDurableSteady with runs on active threads of each machine.
func benchSteady(b *testing.B, active int) {
	const (
		machines = 100
		threads  = 1000 // per machine
		rate     = 1000 // runs per second, all machines
		step     = 5 * time.Millisecond
	)
	st := storetest.OpenBolt(b)
	now := time.Now()
	for m := range machines {
		machine := fmt.Sprintf("m%03d", m)
		batch := store.Batch{Detector: map[string][]byte{}}
		for t := range threads {
			id := fmt.Sprintf("%s-thread-%04d", machine, t)
			batch.Threads = append(batch.Threads, store.Thread{ID: id, Machine: machine, ProjectID: "project-1", Watch: true, CreatedAt: now, UpdatedAt: now})
			batch.Detector[machine+"\x00"+id] = []byte(`{"run":"seed","settled":true,"updatedAt":"2026-12-01T10:00:00.000Z"}`)
		}
		if err := st.Commit(batch); err != nil {
			b.Fatal(err)
		}
	}
	g := store.NewGroup(st)
	d := events.New(events.Options{Store: g, Tracked: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	// The outbox: every event durable is delivered and its delivery recorded through the group
	// (Group.Record, in the chunks' transactions), as the connector's outbox does at this rate.
	var (
		durableMu sync.Mutex
		durable   []string
	)
	g.OnDurable(func(evs []store.Event) {
		durableMu.Lock()
		for _, e := range evs {
			durable = append(durable, e.ID)
		}
		durableMu.Unlock()
	})
	var timeline commitTimeline
	g.ObserveCommits(timeline.observe)
	recorded := 0
	record := func() error {
		durableMu.Lock()
		ids := durable
		durable = nil
		durableMu.Unlock()
		if len(ids) == 0 {
			return nil
		}
		ops := make([]store.Op, len(ids))
		for i, id := range ids {
			ops[i] = store.Op{ID: id, Kind: store.OpDelivered, At: time.Now()}
		}
		errs, err := g.Record(ops)
		for _, e := range errs {
			if e != nil && err == nil {
				err = e
			}
		}
		recorded += len(ids)
		return err
	}

	type queued struct {
		row    t3rpc.ThreadShell
		sent   time.Time
		settle bool
	}
	type machineQ struct {
		mu   sync.Mutex
		rows []queued
		wake chan struct{}
	}
	qs := make([]*machineQ, machines)
	for i := range qs {
		qs[i] = &machineQ{wake: make(chan struct{}, 1)}
	}
	var (
		latMu      sync.Mutex
		eventLat   []time.Duration
		chunkLat   []time.Duration
		chunkItems int
		// committing chunks, and the transactions the group took while each waited: 1 for its
		// own, 0 when it joined the one being written.
		committing, taken int
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, machines+1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := record(); err != nil {
				errs <- err
				return
			}
		}
	}()
	for m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := qs[m]
			machine := fmt.Sprintf("m%03d", m)
			for {
				select {
				case <-ctx.Done():
					return
				case <-q.wake:
				}
				q.mu.Lock()
				chunk := q.rows
				q.rows = nil
				q.mu.Unlock()
				if len(chunk) == 0 {
					continue
				}
				// As the watcher builds it: the last row of each thread, earlier ones passed.
				c := watch.Change{Machine: machine}
				idx := map[string]int{}
				for j := range chunk {
					r := &chunk[j]
					if i, ok := idx[r.row.ID]; ok {
						c.Passed = append(c.Passed, c.Threads[i])
						c.Threads[i] = &r.row
						continue
					}
					idx[r.row.ID] = len(c.Threads)
					c.Threads = append(c.Threads, &r.row)
				}
				start := time.Now()
				txs0, _ := g.Stats()
				// As the watcher offers it: at once on the socket's read loop when nothing is
				// to commit (ApplyQuick), else Apply.
				if !d.ApplyQuick(c) {
					if err := d.Apply(ctx, c); err != nil {
						errs <- err
						return
					}
				}
				done := time.Now()
				txs1, _ := g.Stats()
				commits := false
				for _, r := range chunk {
					commits = commits || r.settle || r.row.Status == "starting"
				}
				latMu.Lock()
				chunkLat = append(chunkLat, done.Sub(start))
				chunkItems += len(chunk)
				for _, r := range chunk {
					if r.settle {
						eventLat = append(eventLat, done.Sub(r.sent))
					}
				}
				if commits {
					committing++
					taken += int(txs1 - txs0)
				}
				latMu.Unlock()
			}
		}()
	}

	// The driver: a run starts every 1/rate on the next machine's next thread; every queued run
	// publishes its next row each step.
	type run struct {
		m, steps   int
		thread, id string
		next       time.Time
	}
	statuses := []string{"starting", "running", "running", "running", "running", "running", "waiting", "completed"}
	publish := func(r *run, at time.Time) {
		status := statuses[r.steps]
		row := t3rpc.ThreadShell{ID: r.thread, ProjectId: "project-1", Title: "Fix the flaky payment test", Status: status,
			LatestRunId: t3rpc.NewOptNilString(r.id), UpdatedAt: t3rpc.NewOptString(at.UTC().Format("2006-01-02T15:04:05.000000Z"))}
		settle := status == "completed"
		if settle {
			row.LatestRunCompletedAt = t3rpc.NewOptNilString(at.UTC().Format(time.RFC3339Nano))
		}
		if settle || status == "waiting" {
			// T3 drops activeRunId when the turn is over, before the checkpoint (recorded; the
			// fake's stepWaiting does the same).
			row.ActiveRunId = t3rpc.NewOptNilString("")
			row.ActiveRunId.Null = true
		} else {
			row.ActiveRunId = t3rpc.NewOptNilString(r.id)
		}
		q := qs[r.m]
		q.mu.Lock()
		q.rows = append(q.rows, queued{row: row, sent: at, settle: settle})
		q.mu.Unlock()
		select {
		case q.wake <- struct{}{}:
		default:
		}
		r.steps++
		r.next = at.Add(step)
	}
	var runs []*run
	nextThread := make([]int, machines)
	b.ReportAllocs()
	b.ResetTimer()
	timeline.reset()
	cpu0 := processCPU(b)
	t0 := time.Now()
	started := 0
	tick := time.NewTicker(time.Millisecond)
	for started < b.N || len(runs) > 0 {
		now := <-tick.C
		for started < b.N && time.Duration(started)*time.Second/rate <= now.Sub(t0) {
			m := started % machines
			t := nextThread[m] % active
			nextThread[m]++
			r := &run{m: m, thread: fmt.Sprintf("m%03d-thread-%04d", m, t), id: fmt.Sprintf("run-%d", started)}
			publish(r, time.Now())
			runs = append(runs, r)
			started++
		}
		runs = slices.DeleteFunc(runs, func(r *run) bool {
			if !now.Before(r.next) {
				publish(r, time.Now())
			}
			return r.steps == len(statuses)
		})
	}
	tick.Stop()
	// Wait until every event is durable.
	for {
		latMu.Lock()
		n := len(eventLat)
		latMu.Unlock()
		if n >= b.N {
			break
		}
		select {
		case err := <-errs:
			b.Fatal(err)
		case <-time.After(time.Millisecond):
		}
	}
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	timeline.report(b, b.N)
	cancel()
	wg.Wait()
	if err := record(); err != nil {
		b.Fatal(err)
	}
	q := func(l []time.Duration, p float64) float64 {
		slices.Sort(l)
		return float64(l[min(len(l)-1, int(p*float64(len(l))))]) / 1e6
	}
	b.ReportMetric(q(eventLat, 0.5), "event-p50-ms")
	b.ReportMetric(q(eventLat, 0.99), "event-p99-ms")
	b.ReportMetric(q(chunkLat, 0.5), "chunk-p50-ms")
	b.ReportMetric(q(chunkLat, 0.99), "chunk-p99-ms")
	b.ReportMetric(float64(chunkItems)/float64(len(chunkLat)), "rows/chunk")
	b.ReportMetric(float64(taken)/float64(max(committing, 1)), "txs-taken/commit")
	txs, batches := g.Stats()
	b.ReportMetric(float64(txs)/float64(b.N), "txs/run")
	b.ReportMetric(float64(batches)/float64(b.N), "batches/run")
	// The whole process's: the driver and the recorder are in it too, the same work in any tree.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/run")
	if p, _, delivered, err := st.Counts(); err != nil || p != 0 || delivered != b.N || recorded != b.N {
		b.Fatalf("%d events pending, %d delivered (%d recorded) for %d runs (%v)", p, delivered, recorded, b.N, err)
	}
}

// processCPU is the CPU time (user and system) the process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
