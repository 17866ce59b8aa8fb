package main

import (
	"bytes"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ms = time.Millisecond

// Late windows that overlap on both CPUs by at least the minimum are a stall of the machine;
// one CPU's alone, or overlaps shorter than the minimum, are not.
func TestStallsOnAllJoinsTheCPUs(t *testing.T) {
	res := []cpuResult{
		{CPU: 0, Late: []lateWake{{End: 110 * ms, Over: 12 * ms}, {End: 300 * ms, Over: 5 * ms}, {End: 500 * ms, Over: 4 * ms}}},
		{CPU: 1, Late: []lateWake{{End: 111 * ms, Over: 10 * ms}, {End: 296 * ms, Over: 3 * ms}, {End: 700 * ms, Over: 9 * ms}}},
	}
	got := stallsOnAll(res, ms)
	want := []stall{{From: 101 * ms, To: 110 * ms}, {From: 295 * ms, To: 296 * ms}}
	if len(got) != len(want) {
		t.Fatalf("stalls %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("stall %d is %v, want %v (all: %v)", i, got[i], want[i], got)
		}
	}
	if s := stallsOnAll(res, 2*ms); len(s) != 1 {
		t.Fatalf("with a 2 ms minimum: %v, want only the 9 ms stall", s)
	}
	// A third CPU that was on time throughout: the machine ran, so no stall.
	res = append(res, cpuResult{CPU: 2})
	if s := stallsOnAll(res, ms); len(s) != 0 {
		t.Fatalf("a CPU without a late wake-up still gives stalls: %v", s)
	}
}

// A short real run: every allowed CPU gets a sleeper pinned to it that wakes many times, and
// the report names each CPU and the joined stalls.
func TestMeasureAndReport(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) == 0 {
		t.Fatal("no CPU allowed")
	}
	length := 300 * ms
	res := measure(cpus, length, ms, 3*ms, 0)
	if len(res) != len(cpus) {
		t.Fatalf("%d results for %d CPUs", len(res), len(cpus))
	}
	for i, r := range res {
		if r.CPU != cpus[i] {
			t.Fatalf("result %d is for CPU %d, want %d", i, r.CPU, cpus[i])
		}
		// 300 ms of 1 ms sleeps: even a starved machine (every package's tests at once) wakes a sleeper a few times.
		if len(r.Over) < 5 {
			t.Fatalf("CPU %d: %d wake-ups in %v", r.CPU, len(r.Over), length)
		}
		for _, l := range r.Late {
			if l.Over < 3*ms || l.End > length+time.Second {
				t.Fatalf("CPU %d: late wake-up %+v outside the run or under the threshold", r.CPU, l)
			}
		}
	}
	var b bytes.Buffer
	report(&b, res, length, ms, 3*ms)
	out := b.String()
	for _, c := range cpus {
		name := "cpu " + strconv.Itoa(c)
		if !strings.Contains(out, name+":") && !strings.Contains(out, name+" (") {
			t.Fatalf("report does not name CPU %d:\n%s", c, out)
		}
	}
	if len(cpus) > 1 && !strings.Contains(out, "every CPU late at once") {
		t.Fatalf("report without the joined stalls:\n%s", out)
	}
}

// -list prints each late wake-up's window on the monotonic clock: start plus its offsets.
func TestListLate(t *testing.T) {
	res := []cpuResult{
		{CPU: 0, Late: []lateWake{{End: 110 * ms, Over: 12 * ms}}},
		{CPU: 3, Late: []lateWake{{End: 111 * ms, Over: 10 * ms}}},
	}
	var b bytes.Buffer
	listLate(&b, res, 5*time.Second)
	want := "late cpu 0 from 5098000000 to 5110000000 (12.00 ms)\n" +
		"late cpu 3 from 5101000000 to 5111000000 (10.00 ms)\n" +
		"stall from 5101000000 to 5110000000 (9.00 ms)\n"
	if b.String() != want {
		t.Fatalf("got\n%swant\n%s", b.String(), want)
	}
}

// -fifo: the sleeper's thread is a SCHED_FIFO thread at the asked priority when the kernel
// lets this process have one, and the report says which it was either way.
func TestFIFOSleepers(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	// setFIFO itself, read back with sched_getattr on a thread that is then let go with its
	// goroutine (locked for good, as the sleepers are).
	got := make(chan error, 1)
	var policy, prio uint32
	go func() {
		runtime.LockOSThread()
		if err := setFIFO(7); err != nil {
			got <- err
			return
		}
		a, err := unix.SchedGetAttr(0, 0)
		if err == nil {
			policy, prio = a.Policy, a.Priority
		}
		got <- err
	}()
	canFIFO := true
	if err := <-got; err != nil {
		if !errors.Is(err, unix.EPERM) {
			t.Fatalf("setFIFO: %v", err)
		}
		canFIFO = false // not root, no CAP_SYS_NICE: the refusal path below
	} else if policy != unix.SCHED_FIFO || prio != 7 {
		t.Fatalf("after setFIFO(7) the thread has policy %d priority %d", policy, prio)
	}

	res := measure(cpus, 100*ms, ms, 3*ms, 9)
	var b bytes.Buffer
	report(&b, res, 100*ms, ms, 3*ms)
	for _, r := range res {
		if canFIFO && (r.FIFO != 9 || r.FIFOErr != nil) {
			t.Fatalf("CPU %d: FIFO %d, %v; want priority 9", r.CPU, r.FIFO, r.FIFOErr)
		}
		if !canFIFO && (r.FIFO != 0 || r.FIFOErr == nil) {
			t.Fatalf("CPU %d: FIFO %d with the kernel refusing it", r.CPU, r.FIFO)
		}
		if len(r.Over) == 0 {
			t.Fatalf("CPU %d: no wake-up", r.CPU)
		}
	}
	want := "(SCHED_FIFO 9)"
	if !canFIFO {
		want = "(an ordinary thread: sched_setattr SCHED_FIFO 9"
	}
	if strings.Count(b.String(), want) != len(cpus) {
		t.Fatalf("report should say %q for each of %d CPUs:\n%s", want, len(cpus), b.String())
	}
}

// Flags that would measure nothing, name no priority, or let a real-time sleeper hog its CPU are
// refused with a message naming the flag; the defaults and a real-time run at 1 ms pass.
func TestCheckFlags(t *testing.T) {
	for _, c := range []struct {
		length, sleep, late time.Duration
		fifo                int
		want                string // "" for no error
	}{
		{60 * time.Second, ms, 3 * ms, 0, ""},
		{60 * time.Second, ms, 3 * ms, 50, ""},
		{60 * time.Second, 10 * time.Microsecond, 3 * ms, 0, ""},
		{0, ms, 3 * ms, 0, "-for, -sleep and -late"},
		{time.Second, ms, 0, 0, "-for, -sleep and -late"},
		{time.Second, ms, 3 * ms, 100, "-fifo is a SCHED_FIFO priority"},
		{time.Second, ms, 3 * ms, -1, "-fifo is a SCHED_FIFO priority"},
		{time.Second, 10 * time.Microsecond, 3 * ms, 50, "-sleep 10µs with -fifo"},
	} {
		err := checkFlags(c.length, c.sleep, c.late, c.fifo)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one containing %q", c, err, c.want)
		}
	}
}
