package t3

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// loadPrompt is the load harness's prompt (internal/loadtest.Prompt): the fake's messages and
// replies quote it, so the bodies have the harness's sizes.
const loadPrompt = "Fix the flaky test in the payment service: the retry loop asserts before the ledger has settled, " +
	"so make it wait for the settlement event and run the whole suite afterwards."

// fakeBounded is the fake T3's GET …/threads/{id}/bounded body for a thread that ran runs
// default-script runs (five turn items each), as the load harness's t3_thread phase reads it:
// with an attempt and a node per run (t3fake.Options.ControlPlane, the harness's default), as T3's.
func fakeBounded(t testing.TB, runs int) []byte {
	t.Helper()
	fk, err := t3fake.New(t3fake.Options{ManualSteps: true, KeepRuns: -1, ControlPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fk.Close()
	tid := fk.AddThread(fk.AddProject("payments", "/srv/payments"), "Fix the flaky payment test", "idle")
	for i := range runs {
		if _, err := fk.StartRun(tid, fmt.Sprintf("%s (attempt %d)", loadPrompt, i+1)); err != nil {
			t.Fatal(err)
		}
		fk.StepAll()
	}
	req, _ := http.NewRequest("GET", fk.URL()+"/api/orchestration/threads/"+tid+"/bounded", nil)
	req.Header.Set("Authorization", "Bearer "+fk.Token())
	req.Header.Set("x-t3-orchestration-protocol", "2")
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("GET bounded: %d %v", res.StatusCode, err)
	}
	return body
}

// threadCPU is the calling thread's user+system CPU time so far.
func threadCPU(b *testing.B) time.Duration { return cpuTime(b, syscall.RUSAGE_THREAD) }

// processCPU is the process's user+system CPU time so far (every goroutine's,
// the garbage collector's included).
func processCPU(b *testing.B) time.Duration { return cpuTime(b, syscall.RUSAGE_SELF) }

func cpuTime(b *testing.B, who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTrimBounded is the trim of the fake's bounded bodies of 500, 5,000 and 50,000 turn
// items (100 / 1,000 / 10,000 runs), keeping what t3_thread keeps (3 runs). A version written on
// jx's Decoder (Raw and Skip) was 3× slower on the same bodies and was dropped
// (docs/benchmarks.md).
func BenchmarkTrimBounded(b *testing.B) {
	for _, runs := range []int{100, 1_000, 10_000} {
		body := fakeBounded(b, runs)
		for _, impl := range []struct {
			name string
			trim func([]byte, Keep) ([]byte, int, error)
		}{{"scanner", trimBounded}} {
			b.Run(fmt.Sprintf("items=%d/%s", runs*5, impl.name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0 := threadCPU(b)
				for b.Loop() {
					if _, _, err := impl.trim(body, Keep{Runs: 3}); err != nil {
						b.Fatal(err)
					}
				}
				// The goroutine's own CPU (it is locked to its thread): on a shared machine
				// wall time says more about the neighbours than about the code.
				b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
