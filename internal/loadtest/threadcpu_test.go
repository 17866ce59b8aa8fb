package loadtest

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// burn keeps a thread of its own on a CPU until the thread's own schedstat has grown (work that
// must be counted), and returns that thread's id.
func burn(t *testing.T) string {
	t.Helper()
	id := make(chan string)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := "thread-self"
		if link, err := os.Readlink("/proc/thread-self"); err == nil {
			tid = link[len(link)-len(fmtBase(link)):]
		}
		t0, err := readTaskTimes(os.Getpid())
		if err != nil {
			t.Error(err)
		}
		x := 0
		for {
			for i := range 1_000_000 {
				x += i
			}
			t1, err := readTaskTimes(os.Getpid())
			if err != nil || t1[tid] > t0[tid] {
				break
			}
		}
		_ = x
		id <- tid
	}()
	return <-id
}

// fmtBase is the last element of a /proc path.
func fmtBase(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// TestTaskTimesCountTheProcessInNanoseconds: the threads' schedstat sum grows with work done on
// any thread, by the work's nanoseconds (not in ticks: a window of less than a tick is not 0 or
// 10 ms), and a window in which a thread ended is not taken (its time went with it): the ticks
// of /proc/<pid>/stat are kept then.
func TestTaskTimesCountTheProcessInNanoseconds(t *testing.T) {
	pid := os.Getpid()
	t0, err := readTaskTimes(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(t0) == 0 {
		t.Fatal("no thread read")
	}
	tid := burn(t)
	t1, err := readTaskTimes(pid)
	if err != nil {
		t.Fatal(err)
	}
	cpu, ok := t1.since(t0)
	if !ok || cpu <= 0 {
		t.Fatalf("since = %v, %v after work on thread %s", cpu, ok, tid)
	}
	if cpu%(10*time.Millisecond) == 0 {
		t.Fatalf("since = %v: ticks, not nanoseconds", cpu)
	}
	if got := (preciseCPU{pid, t0}).of(time.Hour); got == time.Hour {
		t.Fatal("the window fell back to the ticks with every thread alive")
	}

	// A thread that ends takes its time with it: the window keeps the ticks.
	if _, ok := t1.since(taskTimes{"0": 0}); ok {
		t.Fatal("since took a window in which a thread ended")
	}
	if got := (preciseCPU{pid, taskTimes{"0": 0}}).of(42 * time.Millisecond); got != 42*time.Millisecond {
		t.Fatalf("a window in which a thread ended gave %v, want the ticks (42ms)", got)
	}
}
