// Command t3code-load is the connector's load harness: it builds (or takes) the t3code-mcp
// binary, runs it as `serve` against fake T3 machines on 127.0.0.1, drives runs, t3_wait calls
// and webhook deliveries, and prints what it measured. Every phase is bounded; the run stops by
// itself. See docs/benchmarks.md.
//
//	t3code-load            the full profile (100 machines × 1,000 threads, 1,000 waits, …)
//	t3code-load -short     the CI profile (a few seconds per phase)
//	t3code-load -m 10 -t 500 -k 200 -e 500 -duration 10s -json out.json
//	t3code-load -phases outage -outage 10m -outage-rate 100   the 60,000-event backlog, the slow way
//	t3code-load -short -phases soak -soak-duration 15m          state file and RSS over time, short retention
//	t3code-load -database-url postgres://… -replicas 3   the same on PostgreSQL, three replicas
//
// The -json report's field names are stable (docs/benchmarks.md lists them; a test fails when one
// changes): compare runs with it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/loadtest"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("t3code-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	short := fs.Bool("short", false, "the CI profile: every phase, scaled down to seconds")
	bin := fs.String("bin", "", "t3code-mcp binary to run; default: go build ./cmd/t3code-mcp into the work directory")
	dir := fs.String("dir", "", "work directory (state, t3code.toml, connector.log), kept afterwards; default: a temporary one")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file")
	quiet := fs.Bool("q", false, "no progress lines")
	inProcess := fs.Bool("inprocess", false, "run the connector inside this process (for profiles; its CPU and RSS then include the harness)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (implies -inprocess)")
	blockProfile := fs.String("blockprofile", "", "write a block profile of the whole run (implies -inprocess)")
	memProfile := fs.String("memprofile", "", "write a heap profile once the connector is synced and idle, and FILE.backlog when the outage phase's receiver comes back (implies -inprocess)")
	harnessProfile := fs.String("harness-cpuprofile", "", "write a CPU profile of the harness alone (fakes, clients, receiver); the connector stays the binary")
	threadCalls := fs.Int("thread-calls", 0, "t3_thread calls on the big thread (full 50, short 20)")

	// Zero means the profile's value.
	m := fs.Int("m", 0, "M: fake T3 machines (full 100, short 4)")
	t := fs.Int("t", 0, "T: threads per machine (full 1000, short 250)")
	k := fs.Int("k", 0, "K: concurrent t3_wait calls (full 1000, short 100)")
	e := fs.Float64("e", 0, "E: settled runs (transitions) per second in the latency phase (full 1000, short 200)")
	peak := fs.Float64("peak", 0, "runs per second offered in the throughput phase (full 5000, short 1000)")
	duration := fs.Duration("duration", 0, "length of the latency and of the throughput phase (full 20s, short 5s)")
	script := fs.String("script", "", "fake script of rate-driven runs: default (7 steps, completed) or fail (2 steps, failed)")
	pollers := fs.String("poll", "", "comparison pollers interval:runs,… (full 1s:200,30s:50; short 1s:20,5s:10)")
	push := fs.Int("push", 0, "comparison runs noticed through the connector (full 200, short 20)")
	runLength := fs.Duration("run-length", 0, "comparison runs settle uniformly within this (full 60s, short 5s)")
	big := fs.Int("thread-items", 0, "turn items of the t3_thread thread, -1 for none (5000)")
	drain := fs.Duration("drain", 0, "longest wait for deliveries after a phase (full 60s, short 30s)")
	logLevel := fs.String("log-level", "", "the connector's log level (info)")
	seedRuns := fs.Int("seed-runs", 0, "finished runs every thread has before the connector starts, -1 for none (1)")
	phases := fs.String("phases", "", "comma-separated phases to run of thread,latency,compare,throughput,outage,soak (default all but soak)")
	outage := fs.Duration("outage", 0, "outage phase: how long the webhook receiver answers 503 (full 60s, short 10s)")
	outageRate := fs.Float64("outage-rate", 0, "outage phase: runs per second settling while the receiver is down (full 1000, short 200)")
	outageThreads := fs.Int("outage-threads", 0, "outage phase: threads per machine the runs go to, so each has several events queued (full 100, short 50)")
	outageDrain := fs.Duration("outage-drain", 0, "outage phase: longest wait for the backlog to drain once the receiver is back (full 3m, short 1m)")
	soak := fs.Duration("soak-duration", 0, "soak phase: how long runs are offered (full 15m, short 2m)")
	soakRate := fs.Float64("soak-rate", 0, "soak phase: runs per second on the watched threads (full 200, short 50)")
	soakChurn := fs.Float64("soak-churn", 0, "soak phase: new threads per second watched, unwatched and archived (full 2, short 1)")
	soakRetention := fs.Duration("soak-retention", 0, "soak phase: the connector's T3CODE_MCP_HOOK_RETENTION and T3CODE_MCP_THREAD_RETENTION (full 2m, short 15s); pruned every quarter of it")
	soakSample := fs.Duration("soak-sample", 0, "soak phase: how often RSS, heap, state file and tracked threads are sampled (full 30s, short 5s)")
	databaseURL := fs.String("database-url", "", "run the connector on this PostgreSQL database (postgres://…, an empty one) instead of a bbolt file")
	replicas := fs.Int("replicas", 1, "connectors sharing -database-url (lease per machine, any replica delivers); the first one is measured")
	noHook := fs.Bool("no-hook", false, "run without T3CODE_MCP_HOOK_URL (no events: the wait path alone)")
	timeout := fs.Duration("timeout", 0, "bound on the whole run (default: from the phases)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := loadtest.Full()
	if *short {
		cfg = loadtest.Short()
	}
	setI := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setI(&cfg.Machines, *m)
	setI(&cfg.Threads, *t)
	setI(&cfg.Waits, *k)
	setI(&cfg.PushRuns, *push)
	setI(&cfg.BigThreadItems, *big)
	setI(&cfg.ThreadCalls, *threadCalls)
	setI(&cfg.SeedRuns, *seedRuns)
	cfg.NoHook = *noHook
	cfg.DatabaseURL, cfg.Replicas = *databaseURL, *replicas
	if *replicas > 1 && *databaseURL == "" {
		fmt.Fprintln(stderr, "t3code-load: -replicas needs -database-url (replicas share a PostgreSQL database)")
		return 2
	}
	if *phases != "" {
		cfg.Phases = strings.Split(*phases, ",")
	}
	if *e != 0 {
		cfg.Rate = *e
	}
	if *peak != 0 {
		cfg.PeakRate = *peak
	}
	if *duration != 0 {
		cfg.Duration = *duration
	}
	if *runLength != 0 {
		cfg.RunLength = *runLength
	}
	if *drain != 0 {
		cfg.Drain = *drain
	}
	if *outage != 0 {
		cfg.Outage = *outage
	}
	if *outageRate != 0 {
		cfg.OutageRate = *outageRate
	}
	setI(&cfg.OutageThreads, *outageThreads)
	setD := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	setD(&cfg.Soak, *soak)
	setD(&cfg.SoakRetention, *soakRetention)
	setD(&cfg.SoakSample, *soakSample)
	if *soakRate != 0 {
		cfg.SoakRate = *soakRate
	}
	if *soakChurn != 0 {
		cfg.SoakChurn = *soakChurn
	}
	if *outageDrain != 0 {
		cfg.OutageDrain = *outageDrain
	}
	if *script != "" {
		cfg.Script = *script
	}
	if *logLevel != "" {
		cfg.LogLevel = *logLevel
	}
	if *pollers != "" {
		p, err := loadtest.ParsePollers(*pollers)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		cfg.Pollers = p
	}
	cfg.Timeout = *timeout
	cfg.WorkDir = *dir
	if !*quiet {
		cfg.Progress = stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The harness holds every fake machine's state: collect its garbage less often, so that its
	// own GC disturbs the timings less (memory here is not what is measured).
	debug.SetGCPercent(400)

	cfg.InProcess = *inProcess || (*cpuProfile != "" && *harnessProfile == "") || *blockProfile != "" || *memProfile != ""
	if *memProfile != "" {
		cfg.AfterStartup = func() {
			runtime.GC()
			if err := writeProfile(*memProfile, "heap"); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}
		// The outage phase's backlog: the second heap profile, under lag.
		cfg.AtBacklog = func() {
			if err := writeProfile(*memProfile+".backlog", "heap"); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}
	}
	if *blockProfile != "" {
		runtime.SetBlockProfileRate(int(100 * time.Microsecond))
		defer func() {
			if err := writeProfile(*blockProfile, "block"); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}()
	}
	if *cpuProfile == "" && *harnessProfile != "" {
		*cpuProfile = *harnessProfile
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	cfg.Binary = *bin
	if cfg.Binary == "" && !cfg.InProcess {
		tmp, err := os.MkdirTemp("", "t3code-load-bin-")
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		cfg.Binary = filepath.Join(tmp, "t3code-mcp")
		fmt.Fprintln(stderr, "building ./cmd/t3code-mcp")
		bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(bctx, "go", "build", "-o", cfg.Binary, "./cmd/t3code-mcp")
		cmd.Stdout, cmd.Stderr = stderr, stderr
		err = cmd.Run()
		cancel()
		if err != nil {
			fmt.Fprintln(stderr, "go build ./cmd/t3code-mcp:", err)
			return 1
		}
	}

	rep, err := loadtest.Run(ctx, cfg)
	if rep != nil {
		fmt.Fprint(stdout, rep.Text())
		if *jsonOut != "" {
			b, jerr := json.MarshalIndent(rep, "", "  ")
			if jerr == nil {
				jerr = os.WriteFile(*jsonOut, b, 0o644)
			}
			if jerr != nil {
				fmt.Fprintln(stderr, "writing", *jsonOut+":", jerr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "t3code-load:", err)
		return 1
	}
	return 0
}

func writeProfile(path, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
