// Command wakefloor measures how late this machine wakes a sleeping thread: one sleeper
// thread pinned to each CPU sleeps -sleep in a loop (clock_nanosleep, its timer on its own
// CPU) for -for, and it reports each CPU's oversleep and the stalls seen on every CPU at once.
//
//	go run ./scripts/wakefloor [-for 60s] [-sleep 1ms] [-late 3ms] [-fifo 50] [-list]
//
// Why: a wake-up the connector cannot make faster is a floor under its wake and first-call
// latencies (docs/benchmarks.md, "The machine's own stalls"). On a virtual machine a vCPU
// the host does not run sees no timer, no interrupt and no scheduler event until the host
// runs it again, and the guest counts none of it as steal; sleepers late on every CPU at
// the same moment, by about as much, are that stall's signature. Run it alone for the
// idle floor, or beside `t3code-load` for what the machine adds under load. Under load an
// ordinary sleeper also waits behind a busy CPU; with -fifo the sleepers run at that
// SCHED_FIFO priority, so they take the CPU from any ordinary thread the moment their timer
// fires, and a late one means the CPU itself did not run (needs CAP_SYS_NICE: root).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	fs := flag.NewFlagSet("wakefloor", flag.ContinueOnError)
	length := fs.Duration("for", 60*time.Second, "how long to measure")
	sleep := fs.Duration("sleep", time.Millisecond, "each sleeper's sleep")
	late := fs.Duration("late", 3*time.Millisecond, "an oversleep at least this long is a late wake-up (counted per CPU and joined across CPUs)")
	fifo := fs.Int("fifo", 0, "run the sleepers at this SCHED_FIFO priority (1-99; 0: ordinary threads), so that under load a late one means the CPU did not run, not that it ran something else")
	list := fs.Bool("list", false, "also print every late wake-up and every joined stall, at CLOCK_MONOTONIC times (ns), to join with other records (runtime traces carry that clock)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := checkFlags(*length, *sleep, *late, *fifo); err != nil {
		fmt.Fprintln(os.Stderr, "wakefloor:", err)
		os.Exit(2)
	}
	cpus, err := allowedCPUs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "wakefloor:", err)
		os.Exit(1)
	}
	var mono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		fmt.Fprintln(os.Stderr, "wakefloor: reading CLOCK_MONOTONIC:", err)
		os.Exit(1)
	}
	res := measure(cpus, *length, *sleep, *late, *fifo)
	report(os.Stdout, res, *length, *sleep, *late)
	if *list {
		listLate(os.Stdout, res, time.Duration(mono.Nano()))
	}
}

// minFIFOSleep is the shortest -sleep a real-time sleeper may have: it takes its CPU from every
// ordinary thread each time it wakes, so a sleep much shorter than that would keep the CPU from
// the rest of the machine (the kernel caps real-time threads at 95 % of each second only).
const minFIFOSleep = 100 * time.Microsecond

// checkFlags refuses flag values that measure nothing or that would hog the machine.
func checkFlags(length, sleep, late time.Duration, fifo int) error {
	switch {
	case length <= 0 || sleep <= 0 || late <= 0:
		return fmt.Errorf("-for, -sleep and -late must be above zero")
	case fifo < 0 || fifo > 99:
		return fmt.Errorf("-fifo is a SCHED_FIFO priority, 1 to 99, or 0 for none (got %d)", fifo)
	case fifo > 0 && sleep < minFIFOSleep:
		return fmt.Errorf("-sleep %v with -fifo: a real-time sleeper must sleep at least %v, or it takes the CPU from everything else", sleep, minFIFOSleep)
	}
	return nil
}

// allowedCPUs is the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("reading the CPUs this process may use: %w", err)
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// lateWake is one wake-up at least -late after its sleep should have ended: the window
// [End-Over, End] from the start of the measurement is when that CPU did not run the sleeper.
type lateWake struct {
	End, Over time.Duration
}

// cpuResult is one sleeper's wake-ups.
type cpuResult struct {
	CPU    int
	Pinned bool
	// FIFO is the SCHED_FIFO priority the sleeper ran at, 0 for an ordinary thread (none
	// asked, or the kernel refused: FIFOErr says why).
	FIFO    int
	FIFOErr error
	Over    []time.Duration // every wake-up's oversleep
	Late    []lateWake
}

// measure runs one pinned sleeper per CPU for length, at SCHED_FIFO priority fifo when it
// is above 0.
func measure(cpus []int, length, sleep, late time.Duration, fifo int) []cpuResult {
	// A P for every sleeper and the rest: a sleeper coming back from its syscall never
	// waits for one.
	if runtime.GOMAXPROCS(0) < len(cpus)+2 {
		runtime.GOMAXPROCS(len(cpus) + 2)
	}
	start := time.Now()
	res := make([]cpuResult, len(cpus))
	var wg sync.WaitGroup
	for i, c := range cpus {
		wg.Go(func() {
			// Locked and never unlocked: the thread, pinned below, ends with this goroutine
			// instead of going back to run others on one CPU.
			runtime.LockOSThread()
			r := cpuResult{CPU: c}
			var set unix.CPUSet
			set.Set(c)
			r.Pinned = unix.SchedSetaffinity(0, &set) == nil
			if fifo > 0 {
				if r.FIFOErr = setFIFO(fifo); r.FIFOErr == nil {
					r.FIFO = fifo
				}
			}
			ts := unix.NsecToTimespec(sleep.Nanoseconds())
			for time.Since(start) < length {
				t0 := time.Now()
				_ = unix.Nanosleep(&ts, nil) // EINTR: a short sleep, counted as it is
				now := time.Now()
				over := now.Sub(t0) - sleep
				r.Over = append(r.Over, over)
				if over >= late {
					r.Late = append(r.Late, lateWake{End: now.Sub(start), Over: over})
				}
			}
			res[i] = r
		})
	}
	wg.Wait()
	return res
}

// setFIFO puts the calling thread in SCHED_FIFO at priority prio. The thread must stay
// locked to its goroutine for good: the runtime would otherwise run other goroutines on a
// real-time thread.
func setFIFO(prio int) error {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
	if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
		return fmt.Errorf("sched_setattr SCHED_FIFO %d: %w", prio, err)
	}
	return nil
}

// stall is a window in which every CPU's sleeper was late at once.
type stall struct {
	From, To time.Duration
}

// stallsOnAll joins the CPUs' late windows: the spans in which each CPU had a late wake-up
// in progress, at least minLen long. One CPU alone late is a busy CPU or a stall of its own;
// every CPU late together, on an otherwise idle machine, is the machine not running.
func stallsOnAll(res []cpuResult, minLen time.Duration) []stall {
	if len(res) == 0 {
		return nil
	}
	cur := windows(res[0].Late)
	for _, r := range res[1:] {
		cur = intersect(cur, windows(r.Late))
	}
	var out []stall
	for _, s := range cur {
		if s.To-s.From >= minLen {
			out = append(out, s)
		}
	}
	return out
}

func windows(l []lateWake) []stall {
	w := make([]stall, 0, len(l))
	for _, x := range l {
		w = append(w, stall{From: x.End - x.Over, To: x.End})
	}
	sort.Slice(w, func(i, j int) bool { return w[i].From < w[j].From })
	return w
}

// intersect is the overlaps of two sorted lists of disjoint windows (a sleeper's windows
// never overlap: each starts after the previous wake-up).
func intersect(a, b []stall) []stall {
	var out []stall
	for i, j := 0, 0; i < len(a) && j < len(b); {
		from, to := max(a[i].From, b[j].From), min(a[i].To, b[j].To)
		if to > from {
			out = append(out, stall{From: from, To: to})
		}
		if a[i].To < b[j].To {
			i++
		} else {
			j++
		}
	}
	return out
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

func report(w io.Writer, res []cpuResult, length, sleep, late time.Duration) {
	fmt.Fprintf(w, "wakefloor: %d CPUs, a %v sleep in a loop on each for %v; late = %v or more\n", len(res), sleep, length, late)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
	for _, r := range res {
		o := append([]time.Duration(nil), r.Over...)
		sort.Slice(o, func(i, j int) bool { return o[i] < o[j] })
		var lateSum time.Duration
		for _, l := range r.Late {
			lateSum += l.Over
		}
		label := "" // how the sleeper ran, when not as asked or when real-time
		if !r.Pinned {
			label = " (not pinned: sched_setaffinity refused)"
		}
		switch {
		case r.FIFO > 0:
			label += fmt.Sprintf(" (SCHED_FIFO %d)", r.FIFO)
		case r.FIFOErr != nil:
			label += fmt.Sprintf(" (an ordinary thread: %v)", r.FIFOErr)
		}
		fmt.Fprintf(w, "cpu %d%s: %d wake-ups, oversleep p50 %s p99 %s p99.9 %s max %s; %d late (%s in all)\n",
			r.CPU, label, len(o), ms(quantile(o, .5)), ms(quantile(o, .99)), ms(quantile(o, .999)), ms(quantile(o, 1)), len(r.Late), ms(lateSum))
	}
	if len(res) < 2 {
		return
	}
	st := stallsOnAll(res, time.Millisecond)
	var sum, longest time.Duration
	for _, s := range st {
		sum += s.To - s.From
		longest = max(longest, s.To-s.From)
	}
	fmt.Fprintf(w, "every CPU late at once (overlap of 1 ms or more): %d times, %s in all, longest %s (%.2f%% of the time)\n",
		len(st), ms(sum), ms(longest), 100*float64(sum)/float64(length))
}

// listLate prints each late wake-up and each stall on every CPU with its window in
// CLOCK_MONOTONIC nanoseconds (start is that clock when the measurement began: the offsets
// are taken from Go's monotonic clock, the same clock).
func listLate(w io.Writer, res []cpuResult, start time.Duration) {
	for _, r := range res {
		for _, l := range r.Late {
			fmt.Fprintf(w, "late cpu %d from %d to %d (%.2f ms)\n", r.CPU, int64(start+l.End-l.Over), int64(start+l.End), float64(l.Over)/1e6)
		}
	}
	if len(res) > 1 {
		for _, s := range stallsOnAll(res, time.Millisecond) {
			fmt.Fprintf(w, "stall from %d to %d (%.2f ms)\n", int64(start+s.From), int64(start+s.To), float64(s.To-s.From)/1e6)
		}
	}
}
