package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
)

// After start-up the real binary keeps its warm reserve: the snapshot gate settles the heap, and
// the collector's goal (the runtime's own gauge) is the tight percent the connector reports; with
// GOGC in the environment it is left as the user set it. A 1 MiB reserve over the demo machine's
// small live heap makes the tight percent plainly below the default 100.
func TestServeKeepsAWarmReserve(t *testing.T) {
	tight := regexp.MustCompile(`(?m)^t3code_mcp_memory_heap_reserve_gc_percent (\d+)$`)
	gogc := regexp.MustCompile(`(?m)^go_gc_gogc_percent (\d+)$`)
	for _, tc := range []struct {
		name string
		env  []string
	}{{"reserve", []string{"T3CODE_MCP_HEAP_RESERVE_MB=1"}}, {"GOGC", []string{"T3CODE_MCP_HEAP_RESERVE_MB=1", "GOGC=150"}}} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			env := baseEnv(t, append([]string{"T3CODE_MCP_PORT=" + strconv.Itoa(port), "T3CODE_MCP_STATE_DIR=" + t.TempDir()}, tc.env...)...)
			s := startServe(t, t.TempDir(), env, "serve")
			metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
			var page string
			deadline := time.Now().Add(30 * time.Second)
			// The snapshot gate settles the heap 500 ms after the demo machine's snapshot; the
			// counter is on /metrics once the Returner runs, a moment after the listener.
			settled := func(page string) bool {
				return strings.Contains(page, "\nt3code_mcp_memory_heap_settles_total ") &&
					counter(t, page, "t3code_mcp_memory_heap_settles_total") >= 1
			}
			for page = get(t, metrics); !settled(page); page = get(t, metrics) {
				if time.Now().After(deadline) {
					t.Fatalf("the heap was never settled after start-up:\n%s", page)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// A scrape gathers its collectors side by side: the runtime's may have been read just
			// before the settle ended. The next scrape starts after it.
			page = get(t, metrics)
			m, g := tight.FindStringSubmatch(page), gogc.FindStringSubmatch(page)
			if m == nil || g == nil {
				t.Fatalf("no t3code_mcp_memory_heap_reserve_gc_percent or go_gc_gogc_percent in /metrics:\n%s", page)
			}
			percent, _ := strconv.Atoi(m[1])
			runtimePercent, _ := strconv.Atoi(g[1])
			logs := s.stderr.String()
			if tc.name == "GOGC" {
				if percent != 0 || runtimePercent != 150 || !strings.Contains(logs, "from=GOGC") {
					t.Fatalf("GOGC=150: tight percent %d, the runtime's %d; logs:\n%s", percent, runtimePercent, logs)
				}
			} else if percent >= 100 || percent != runtimePercent {
				t.Fatalf("a 1 MiB reserve: tight percent %d, the runtime's %d; want the same, under 100", percent, runtimePercent)
			}
			if code := s.stop(t); code != 0 {
				t.Fatalf("exit %d\n%s", code, s.stderr)
			}
		})
	}
}

func TestHeapReserve(t *testing.T) {
	s := app.Settings{HeapReserveMB: 16}
	none := func(string) string { return "" }
	if b, ours := heapReserve(s, none); !ours || b != 16<<20 {
		t.Fatalf("heapReserve = %d, %v; want 16 MiB, ours", b, ours)
	}
	withGOGC := func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}
	if b, ours := heapReserve(s, withGOGC); ours || b != 0 {
		t.Fatalf("with GOGC: heapReserve = %d, %v; want none, not ours", b, ours)
	}
}
