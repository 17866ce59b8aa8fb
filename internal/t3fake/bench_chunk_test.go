package t3fake

import (
	"fmt"
	"syscall"
	"testing"
)

// BenchmarkChunkPerStep is the load harness's latency phase on the fakes' sockets: 10 fakes, each
// with one shell subscriber on a socket of its own that acknowledges every Chunk at once (a fast
// connector); each op moves one run on every fake by one transition (a Step, or StartRun once
// the run has settled) and waits until every subscriber has sent its Ack. That is a Chunk and
// an Ack per fake per op, as at 1,000 runs/s on 100 machines, where a machine's steps are 5 ms
// apart and the connector acknowledges in well under that. It reports the process's CPU (fakes
// and subscribers) and its voluntary context switches (threads that slept and were woken) per
// Chunk: the fakes' socket work per Chunk, with the run model's one transition.
func BenchmarkChunkPerStep(b *testing.B) {
	const fakes = 10
	type fake struct {
		s    *Server
		tid  string
		done <-chan struct{}
	}
	acked := make(chan struct{}, fakes)
	var fs []fake
	for i := range fakes {
		s, err := New(Options{ManualSteps: true, KeepRuns: 20})
		if err != nil {
			b.Fatal(err)
		}
		pid := s.AddProject("load", "/srv/load")
		tid := fmt.Sprintf("thread-%08x-1111-4222-8333-%012x", i, i)
		if err := s.AddThreadWithID(pid, tid, fmt.Sprint("Load thread on m-", i)); err != nil {
			b.Fatal(err)
		}
		fs = append(fs, fake{s, tid, ackingSubscriber(b, s, acked)})
	}
	for range 2 * fakes {
		<-acked // the snapshots, then the completion markers
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, sw0 := processCPU(b), voluntarySwitches(b)
	for range b.N {
		for _, f := range fs {
			if !f.s.Step() {
				if _, err := f.s.StartRun(f.tid, loadPrompt); err != nil {
					b.Fatal(err)
				}
			}
		}
		for range fakes {
			<-acked
		}
	}
	b.StopTimer()
	chunks := float64(b.N * fakes)
	b.ReportMetric(float64(processCPU(b)-cpu0)/chunks, "cpu-ns/chunk")
	b.ReportMetric(float64(voluntarySwitches(b)-sw0)/chunks, "wakeups/chunk")
	for _, f := range fs {
		f.s.Close()
		<-f.done
	}
}

// voluntarySwitches is the process's voluntary context switches so far (all its threads).
func voluntarySwitches(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Nvcsw
}
