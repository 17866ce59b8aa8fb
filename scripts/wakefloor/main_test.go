package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
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
	res := measure(cpus, length, ms, 3*ms)
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
		if !strings.Contains(out, name+":") && !strings.Contains(out, name+" (not pinned") {
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
