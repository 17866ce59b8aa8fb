package events

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// trackOn watches thread id on machine m.
func (e *env) trackOn(m, id string) {
	e.t.Helper()
	if err := e.d.Track(m, store.Thread{ID: id, Machine: m, ProjectID: "p1", ProjectTitle: "proj", Watch: true}, &t3rpc.ThreadShell{ID: id, Status: "idle"}); err != nil {
		e.t.Fatal(err)
	}
}

// One machine's read loop never waits for another machine's detector work: while machine a's
// chunk is being judged (held in the middle, its states read and not yet put), machine b's
// chunk is taken at once. Every machine's read loop takes a chunk this way; behind a lock all
// machines share, they queued whenever its holder's thread was off the CPU.
func TestQuickChunkDoesNotWaitForAnotherMachine(t *testing.T) {
	e := newEnv(t, "")
	e.trackOn("a", "ta")
	e.trackOn("b", "tb")
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.d.hooks.quickJudged = func(machine string) {
		if machine == "a" {
			once.Do(func() { close(entered) })
			<-release
		}
	}
	step := func(m, id string) watch.Change {
		return watch.Change{Machine: m, Threads: watch.RowsOf([]t3rpc.ThreadShell{rowAt("2026-12-01T10:00:01Z", id, "running", "r1", "r1", "")})}
	}
	aDone := make(chan bool)
	go func() { aDone <- e.d.ApplyQuick(step("a", "ta")) }()
	<-entered
	bDone := make(chan bool)
	go func() { bDone <- e.d.ApplyQuick(step("b", "tb")) }()
	select {
	case took := <-bDone:
		if !took {
			t.Error("machine b's run step not taken at once")
		}
	case <-time.After(30 * time.Second):
		t.Error("machine b's chunk waited for machine a's")
	}
	close(release)
	if !<-aDone {
		t.Error("machine a's run step not taken at once")
	}
	if t.Failed() {
		<-bDone
	}
}

// Machines' chunks applied at once from a goroutine each (as their read loops do), beside
// tracks of new threads on the same machines and look-ups: every run's end is reported once on
// its own stream, and each thread's cached state is its last row's. With -race this checks that
// each machine's cached states are touched under that machine's lock alone.
func TestMachinesApplyConcurrently(t *testing.T) {
	e := newEnv(t, "")
	const machines, threads, runs = 6, 4, 3
	for m := 0; m < machines; m++ {
		for i := 0; i < threads; i++ {
			e.trackOn(fmt.Sprint("m", m), fmt.Sprintf("m%d-t%d", m, i))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*machines)
	for m := 0; m < machines; m++ {
		machine := fmt.Sprint("m", m)
		wg.Add(2)
		go func() { // the machine's read loop
			defer wg.Done()
			sec := 0
			at := func() string { sec++; return fmt.Sprintf("2026-12-01T10:%02d:%02dZ", sec/60, sec%60) }
			for r := 1; r <= runs; r++ {
				run := fmt.Sprint("r", r)
				for _, status := range []string{"starting", "running", "running"} {
					var rows []t3rpc.ThreadShell
					for i := 0; i < threads; i++ {
						rows = append(rows, rowAt(at(), fmt.Sprintf("%s-t%d", machine, i), status, run, run, ""))
					}
					c := watch.Change{Machine: machine, Threads: watch.RowsOf(rows)}
					if !e.d.ApplyQuick(c) {
						if err := e.d.Apply(context.Background(), c); err != nil {
							errs <- err
							return
						}
					}
				}
				var ends []t3rpc.ThreadShell
				for i := 0; i < threads; i++ {
					ends = append(ends, rowAt(at(), fmt.Sprintf("%s-t%d", machine, i), "completed", "", run, ""))
				}
				if err := e.d.Apply(context.Background(), watch.Change{Machine: machine, Threads: watch.RowsOf(ends)}); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() { // threads tracked on the machine meanwhile (a dispatch), and look-ups run
			defer wg.Done()
			for i := 0; i < 5; i++ {
				id := fmt.Sprintf("%s-new%d", machine, i)
				if err := e.d.Track(machine, store.Thread{ID: id, Machine: machine, ProjectID: "p1", ProjectTitle: "proj", Watch: true}, &t3rpc.ThreadShell{ID: id, Status: "idle"}); err != nil {
					errs <- err
					return
				}
				if _, err := e.d.lookup(context.Background(), key(machine, id)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	evs, err := e.st.Pending(10000)
	if err != nil {
		t.Fatal(err)
	}
	perStream := map[string][]string{}
	for _, ev := range evs {
		var b body
		if err := json.Unmarshal(ev.Body, &b); err != nil {
			t.Fatal(err)
		}
		if want := strings.SplitN(b.ThreadID, "-", 2)[0] + "/" + b.ThreadID; ev.Stream != want {
			t.Fatalf("event of thread %s on stream %s", b.ThreadID, ev.Stream)
		}
		perStream[ev.Stream] = append(perStream[ev.Stream], b.Type[len("thread."):]+" "+b.Run)
	}
	for m := 0; m < machines; m++ {
		for i := 0; i < threads; i++ {
			stream := fmt.Sprintf("m%d/m%d-t%d", m, m, i)
			if got, want := strings.Join(perStream[stream], ","), "completed r1,completed r2,completed r3"; got != want {
				t.Errorf("%s: events %q, want %q", stream, got, want)
			}
			k := key(fmt.Sprint("m", m), fmt.Sprintf("m%d-t%d", m, i))
			if c, ok := e.d.cache.get(k); !ok || c.s.Latest != "r3" || !c.s.Settled {
				t.Errorf("%s: cached state %+v (found %v), want r3 settled", k, c.s, ok)
			}
		}
	}
	if n := len(evs); n != machines*threads*runs {
		t.Errorf("%d events, want %d", n, machines*threads*runs)
	}
}
