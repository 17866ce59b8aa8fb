package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serve runs with the runtime's default processors plus spareProcs, and GOMAXPROCS in the
// environment is left as the user set it: the real binary's own gauge says what it runs with.
func TestServeRunsWithSpareProcs(t *testing.T) {
	gauge := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`)
	for _, tc := range []struct {
		name string
		env  []string
	}{{"default", nil}, {"env", []string{"GOMAXPROCS=3"}}} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			env := baseEnv(t, append([]string{"T3CODE_MCP_PORT=" + strconv.Itoa(port), "T3CODE_MCP_STATE_DIR=" + t.TempDir()}, tc.env...)...)
			s := startServe(t, t.TempDir(), env, "serve")
			var m []string
			deadline := time.Now().Add(30 * time.Second)
			for m == nil {
				m = gauge.FindStringSubmatch(get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", port)))
				if m == nil {
					if time.Now().After(deadline) {
						t.Fatal("no go_sched_gomaxprocs_threads in /metrics")
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			got, _ := strconv.Atoi(m[1])
			logs := s.stderr.String()
			if tc.env != nil {
				if got != 3 || !strings.Contains(logs, "from=GOMAXPROCS") {
					t.Fatalf("GOMAXPROCS=3: the process runs with %d processors; logs:\n%s", got, logs)
				}
			} else {
				c := regexp.MustCompile(`gomaxprocs=(\d+) cores=(\d+) spare=2`).FindStringSubmatch(logs)
				if c == nil {
					t.Fatalf("no log line of the processors:\n%s", logs)
				}
				logged, _ := strconv.Atoi(c[1])
				cores, _ := strconv.Atoi(c[2])
				if cores < 1 || got != cores+spareProcs || logged != got {
					t.Fatalf("runs with %d processors, logged %d, cores %d: want cores + %d", got, logged, cores, spareProcs)
				}
			}
			if code := s.stop(t); code != 0 {
				t.Fatalf("exit %d\n%s", code, s.stderr)
			}
		})
	}
}

func TestServeProcs(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMAXPROCS" {
				return v
			}
			return ""
		}
	}
	if n, set := serveProcs(env("")); !set || n != defaultProcs+spareProcs {
		t.Errorf("unset: %d %v, want %d true", n, set, defaultProcs+spareProcs)
	}
	if n, set := serveProcs(env("5")); set || n != 5 {
		t.Errorf("GOMAXPROCS=5: %d %v, want 5 false", n, set)
	}
	// The runtime ignores a value it cannot read and uses its default: so does serve.
	if n, set := serveProcs(env("lots")); !set || n != defaultProcs+spareProcs {
		t.Errorf("GOMAXPROCS=lots: %d %v", n, set)
	}
}
