// Command t3code-load is the connector's load harness: it builds (or takes) the t3code-mcp
// binary, runs it as `serve` against fake T3 machines on 127.0.0.1, drives runs, t3_wait calls
// and webhook deliveries, and prints what it measured. Every phase is bounded; the run stops by
// itself. See docs/benchmarks.md.
//
//	t3code-load            the full profile (100 machines × 1,000 threads, 1,000 waits, …)
//	t3code-load -short     the CI profile (a few seconds per phase)
//	t3code-load -m 10 -t 500 -k 200 -e 500 -duration 10s -json out.json
//	t3code-load -phases outage -outage 10m -outage-rate 100   the 60,000-event backlog, the slow way
//	t3code-load -compression gzip -phases thread,latency      remote machines: answers gzipped, inflated
//	t3code-load -short -phases soak -soak-duration 15m          state file and RSS over time, short retention
//	t3code-load -database-url postgres://… -replicas 3   the same on PostgreSQL, three replicas
//	t3code-load -database-url postgres://… -replicas 3 -replica-env T3CODE_MCP_LEASE_TTL=1500ms
//
// The -json report's field names are stable (docs/benchmarks.md lists them; a test fails when one
// changes): compare runs with it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/loadtest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == clientsCommand {
		os.Exit(serveClients())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// clientsCommand is the hidden subcommand of -split's second process: the webhook receiver and
// the MCP clients, driven by the first over stdin and stdout (loadtest.ServeClients).
const clientsCommand = "harness-clients"

func serveClients() int {
	// An interrupt reaches the whole process group: the first process stops this one, once it
	// has stopped the connector (deliveries until then are counted).
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	if err := loadtest.ServeClients(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "t3code-load", clientsCommand+":", err)
		return 1
	}
	return 0
}

// envList is a repeated -replica-env KEY=VALUE flag.
type envList []string

func (l *envList) String() string { return strings.Join(*l, " ") }

func (l *envList) Set(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	switch {
	case !ok || k == "":
		return fmt.Errorf("%q: want KEY=VALUE", kv)
	case k == "T3CODE_MCP_HOST" || k == "T3CODE_MCP_PORT":
		return fmt.Errorf("%s: the harness picks each connector's listen address (127.0.0.1, a free port)", k)
	}
	*l = append(*l, kv)
	return nil
}

// options is the command line: how to run the harness, and the profile's figures a flag
// overrides (over; zero means the profile's value).
type options struct {
	short, quiet, inProcess, harnessTrace, split         bool
	bin, dir, jsonOut                                    string
	cpuProfile, blockProfile, memProfile, harnessProfile string
	profilePhase                                         string
	traceOut, tracePhase                                 string
	traceAfter, traceFor                                 time.Duration
	phases, pollers                                      string
	threadControlPlane                                   bool
	over                                                 loadtest.Config
}

// parse reads the command line; the error is already written to stderr.
func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("t3code-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.short, "short", false, "the CI profile: every phase, scaled down to seconds")
	fs.StringVar(&o.bin, "bin", "", "t3code-mcp binary to run; default: go build ./cmd/t3code-mcp into the work directory")
	fs.StringVar(&o.dir, "dir", "", "work directory (state, t3code.toml, connector.log), kept afterwards; default: a temporary one")
	fs.StringVar(&o.jsonOut, "json", "", "also write the report as JSON to this file")
	fs.BoolVar(&o.quiet, "q", false, "no progress lines")
	fs.BoolVar(&o.inProcess, "inprocess", false, "run the connector inside this process (for profiles; its CPU and RSS then include the harness)")
	fs.BoolVar(&o.split, "split", false, "run the webhook receiver and the MCP clients (t3_wait, t3_thread, t3_watch) in a second process, as other services would be, not in the one serving the fake machines; event and wake latencies are then taken at their arrival there (wall clock, one machine); off with -trace, whose marks must be in the traced process")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (implies -inprocess)")
	fs.StringVar(&o.blockProfile, "blockprofile", "", "write a block profile of the whole run (implies -inprocess)")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a heap profile once the connector is synced and idle, and FILE.backlog when the outage phase's receiver comes back (implies -inprocess)")
	fs.StringVar(&o.harnessProfile, "harness-cpuprofile", "", "write a CPU profile of the harness alone (fakes, clients, receiver); the connector stays the binary")
	fs.StringVar(&o.profilePhase, "profile-phase", "", "the CPU profile (-cpuprofile or -harness-cpuprofile) covers only this phase (thread, latency, compare, throughput, outage or soak), not the set-up and the others")

	fs.StringVar(&o.traceOut, "trace", "", "write a runtime/trace (go tool trace) of a window of one phase: -trace-after into -trace-phase, for -trace-for (implies -inprocess: connector and harness in one trace)")
	fs.StringVar(&o.tracePhase, "trace-phase", "latency", "the phase -trace covers a window of")
	fs.BoolVar(&o.harnessTrace, "harness-trace", false, "with -trace: trace the harness alone (fakes, clients, receiver) and keep the connector the binary, as -harness-cpuprofile does: where the harness's own goroutines wait for a core")
	fs.DurationVar(&o.traceAfter, "trace-after", 5*time.Second, "how far into -trace-phase the -trace window starts (past the phase's start-up)")
	fs.DurationVar(&o.traceFor, "trace-for", 2*time.Second, "length of the -trace window (a trace grows by tens of MB a second at 1,000 runs/s)")

	// Zero means the profile's value.
	c := &o.over
	fs.IntVar(&c.ThreadCalls, "thread-calls", 0, "t3_thread calls on the big thread (full 50, short 20)")
	fs.IntVar(&c.Machines, "m", 0, "M: fake T3 machines (full 100, short 4)")
	fs.IntVar(&c.Threads, "t", 0, "T: threads per machine (full 1000, short 250)")
	fs.IntVar(&c.Waits, "k", 0, "K: concurrent t3_wait calls (full 1000, short 100)")
	fs.Float64Var(&c.Rate, "e", 0, "E: settled runs (transitions) per second in the latency phase (full 1000, short 200)")
	fs.Float64Var(&c.PeakRate, "peak", 0, "runs per second offered in the throughput phase (full 5000, short 1000)")
	fs.DurationVar(&c.Duration, "duration", 0, "length of the latency and of the throughput phase (full 20s, short 5s)")
	fs.StringVar(&c.Script, "script", "", "fake script of rate-driven runs: default (7 steps, completed) or fail (2 steps, failed)")
	fs.StringVar(&o.pollers, "poll", "", "comparison pollers interval:runs,… (full 1s:200,30s:50; short 1s:20,5s:10)")
	fs.IntVar(&c.PushRuns, "push", 0, "comparison runs noticed through the connector (full 200, short 20)")
	fs.DurationVar(&c.RunLength, "run-length", 0, "comparison runs settle uniformly within this (full 60s, short 5s)")
	fs.IntVar(&c.BigThreadItems, "thread-items", 0, "turn items of the t3_thread thread, -1 for none (5000)")
	fs.IntVar(&c.ThreadFirst, "thread-first", 0, "more threads of as many items, each called once before the repeated calls: first calls, reported apart; -1 for none (full 10, short 5)")
	fs.BoolVar(&c.ThreadWarm, "thread-warm", false, "before the first calls, call t3_thread on a small thread until the connector's heap has settled (a collection, then fewer page faults than calls): first calls on a heap that has cycled, not on the pages start-up returned to the OS")
	fs.BoolVar(&o.threadControlPlane, "thread-control-plane", true, "the big machine's thread reads also carry an attempt and a node per run, as T3's do: a body nearer T3's size; =false: the fake's smaller bodies of before 12-02")
	fs.DurationVar(&c.Drain, "drain", 0, "longest wait for deliveries after a phase (full 60s, short 30s)")
	fs.StringVar(&c.LogLevel, "log-level", "", "the connector's log level (info)")
	fs.IntVar(&c.SeedRuns, "seed-runs", 0, "finished runs every thread has before the connector starts, -1 for none (1)")
	fs.StringVar(&o.phases, "phases", "", "comma-separated phases to run of thread,latency,compare,throughput,outage,soak (default all but soak)")
	fs.DurationVar(&c.Outage, "outage", 0, "outage phase: how long the webhook receiver answers 503 (full 60s, short 10s)")
	fs.Float64Var(&c.OutageRate, "outage-rate", 0, "outage phase: runs per second settling while the receiver is down (full 1000, short 200)")
	fs.IntVar(&c.OutageThreads, "outage-threads", 0, "outage phase: threads per machine the runs go to, so each has several events queued (full 100, short 50)")
	fs.DurationVar(&c.OutageDrain, "outage-drain", 0, "outage phase: longest wait for the backlog to drain once the receiver is back (full 3m, short 1m)")
	fs.DurationVar(&c.Soak, "soak-duration", 0, "soak phase: how long runs are offered (full 15m, short 2m)")
	fs.Float64Var(&c.SoakRate, "soak-rate", 0, "soak phase: runs per second on the watched threads (full 200, short 50)")
	fs.Float64Var(&c.SoakChurn, "soak-churn", 0, "soak phase: new threads per second watched, unwatched and archived (full 2, short 1)")
	fs.DurationVar(&c.SoakRetention, "soak-retention", 0, "soak phase: the connector's T3CODE_MCP_HOOK_RETENTION and T3CODE_MCP_THREAD_RETENTION (full 2m, short 15s); pruned every quarter of it")
	fs.DurationVar(&c.SoakSample, "soak-sample", 0, "soak phase: how often RSS, heap, state file and tracked threads are sampled (full 30s, short 5s)")
	fs.StringVar(&c.DatabaseURL, "database-url", "", "run the connector on this PostgreSQL database (postgres://…, an empty one) instead of a bbolt file")
	fs.IntVar(&c.Replicas, "replicas", 1, "connectors sharing -database-url (lease per machine, any replica delivers); the first one is measured")
	fs.Var((*envList)(&c.ReplicaEnv), "replica-env", "KEY=VALUE added to every connector's environment (each replica, the first included), over the harness's own; repeat it: -replica-env T3CODE_MCP_LEASE_TTL=1500ms -replica-env T3CODE_MCP_CLAIM_TTL=10s")
	fs.StringVar(&c.Compression, "compression", "", "`mode` of the connector's compression key for every machine: auto, gzip or none (default: none written, the connector's auto, which reads these loopback fakes uncompressed); gzip measures the remote-machine case: the fakes gzip their larger answers as T3 does and the connector inflates them)")
	fs.BoolVar(&c.NoHook, "no-hook", false, "run without T3CODE_MCP_HOOK_URL (no events: the wait path alone)")
	fs.BoolVar(&c.LockStep, "lockstep", false, "start every machine's rate-driven runs in the same tick (all machines in phase: -m runs at once every -m/-e seconds), the harness's way before 12-02 15:47 UTC (a66865d); by default the machines' runs are spread over the period")
	fs.DurationVar(&c.Timeout, "timeout", 0, "bound on the whole run (default: from the phases)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.Replicas > 1 && c.DatabaseURL == "" {
		err := errors.New("t3code-load: -replicas needs -database-url (replicas share a PostgreSQL database)")
		fmt.Fprintln(stderr, err)
		return nil, err
	}
	if o.pollers != "" {
		p, err := loadtest.ParsePollers(o.pollers)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, err
		}
		c.Pollers = p
	}
	if o.phases != "" {
		c.Phases = strings.Split(o.phases, ",")
	}
	if o.harnessTrace && o.traceOut == "" {
		err := errors.New("t3code-load: -harness-trace needs -trace")
		fmt.Fprintln(stderr, err)
		return nil, err
	}
	if o.traceOut != "" && !slices.Contains(loadtest.PhaseNames, o.tracePhase) {
		err := fmt.Errorf("t3code-load: -trace-phase %q: not one of %s", o.tracePhase, strings.Join(loadtest.PhaseNames, ", "))
		fmt.Fprintln(stderr, err)
		return nil, err
	}
	if o.profilePhase != "" {
		err := error(nil)
		switch {
		case o.cpuProfile == "" && o.harnessProfile == "":
			err = errors.New("t3code-load: -profile-phase needs -cpuprofile or -harness-cpuprofile")
		case !slices.Contains(loadtest.PhaseNames, o.profilePhase):
			err = fmt.Errorf("t3code-load: -profile-phase %q: not one of %s", o.profilePhase, strings.Join(loadtest.PhaseNames, ", "))
		}
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, err
		}
	}
	return o, nil
}

// config is the profile (-short or the full one) with the flags' figures over it.
func (o *options) config(stderr io.Writer) loadtest.Config {
	cfg := loadtest.Full()
	if o.short {
		cfg = loadtest.Short()
	}
	c := o.over
	override(&cfg.Machines, c.Machines)
	override(&cfg.Threads, c.Threads)
	override(&cfg.Waits, c.Waits)
	override(&cfg.PushRuns, c.PushRuns)
	override(&cfg.BigThreadItems, c.BigThreadItems)
	override(&cfg.ThreadCalls, c.ThreadCalls)
	override(&cfg.ThreadFirst, c.ThreadFirst)
	cfg.ThreadControlPlane = o.threadControlPlane
	cfg.ThreadWarm = c.ThreadWarm
	override(&cfg.SeedRuns, c.SeedRuns)
	override(&cfg.Rate, c.Rate)
	override(&cfg.PeakRate, c.PeakRate)
	override(&cfg.Duration, c.Duration)
	override(&cfg.RunLength, c.RunLength)
	override(&cfg.Drain, c.Drain)
	override(&cfg.Outage, c.Outage)
	override(&cfg.OutageRate, c.OutageRate)
	override(&cfg.OutageThreads, c.OutageThreads)
	override(&cfg.OutageDrain, c.OutageDrain)
	override(&cfg.Soak, c.Soak)
	override(&cfg.SoakRetention, c.SoakRetention)
	override(&cfg.SoakSample, c.SoakSample)
	override(&cfg.SoakRate, c.SoakRate)
	override(&cfg.SoakChurn, c.SoakChurn)
	override(&cfg.Script, c.Script)
	override(&cfg.LogLevel, c.LogLevel)
	if c.Phases != nil {
		cfg.Phases = c.Phases
	}
	if c.Pollers != nil {
		cfg.Pollers = c.Pollers
	}
	cfg.NoHook, cfg.LockStep = c.NoHook, c.LockStep
	cfg.Compression = c.Compression
	cfg.DatabaseURL, cfg.Replicas, cfg.ReplicaEnv = c.DatabaseURL, c.Replicas, c.ReplicaEnv
	cfg.Timeout = c.Timeout
	cfg.WorkDir = o.dir
	if !o.quiet {
		cfg.Progress = stderr
	}
	cfg.InProcess = o.inProcess || (o.cpuProfile != "" && o.harnessProfile == "") || o.blockProfile != "" || o.memProfile != "" || (o.traceOut != "" && !o.harnessTrace)
	cfg.Binary = o.bin
	if o.split && o.traceOut != "" {
		fmt.Fprintln(stderr, "-split: off with -trace (the trace's marks must be in the traced process): one process")
	} else if o.split {
		if exe, err := os.Executable(); err == nil {
			cfg.Split = []string{exe, clientsCommand}
		} else {
			fmt.Fprintln(stderr, "-split: no path to this executable, one process:", err)
		}
	}
	return cfg
}

// override sets *dst to v unless v is zero (the profile's value stays).
func override[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		return 2
	}
	cfg := o.config(stderr)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The harness's garbage is collected at Go's default pace (GOGC 100; GOGC in the environment
	// wins). It once ran at 400 to collect less often, but then no collection came during a
	// phase and everything the fakes allocated was memory never touched before: a page fault
	// per 4 KiB, ~17-20 µs each on this machine, 4.1 per settled run in the throughput phase —
	// more than all the harness's other work (docs/benchmarks.md, "The harness's own cost").

	stopProfiles, err := o.startProfiles(&cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer stopProfiles()

	if cfg.Binary == "" && !cfg.InProcess {
		bin, cleanup, err := buildConnector(ctx, stderr)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer cleanup()
		cfg.Binary = bin
	}

	rep, err := loadtest.Run(ctx, cfg)
	if rep != nil {
		fmt.Fprint(stdout, rep.Text())
		if o.jsonOut != "" {
			b, jerr := json.MarshalIndent(rep, "", "  ")
			if jerr == nil {
				jerr = os.WriteFile(o.jsonOut, b, 0o644)
			}
			if jerr != nil {
				fmt.Fprintln(stderr, "writing", o.jsonOut+":", jerr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "t3code-load:", err)
		return 1
	}
	return 0
}

// startProfiles starts the profiles asked for: the heap profiles through cfg's hooks, the block
// and CPU profiles now; stop writes and closes them.
func (o *options) startProfiles(cfg *loadtest.Config, stderr io.Writer) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if o.memProfile != "" {
		cfg.AfterStartup = func() {
			runtime.GC()
			if err := writeProfile(o.memProfile, "heap"); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}
		// The outage phase's backlog: the second heap profile, under lag.
		cfg.AtBacklog = func() {
			if err := writeProfile(o.memProfile+".backlog", "heap"); err != nil {
				fmt.Fprintln(stderr, err)
			}
		}
	}
	if o.blockProfile != "" {
		runtime.SetBlockProfileRate(int(100 * time.Microsecond))
		stops = append(stops, func() {
			if err := writeProfile(o.blockProfile, "block"); err != nil {
				fmt.Fprintln(stderr, err)
			}
		})
	}
	if o.traceOut != "" {
		stopTrace, err := o.startTrace(cfg, stderr)
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, stopTrace)
	}
	cpuProfile := o.cpuProfile
	if cpuProfile == "" && o.harnessProfile != "" {
		cpuProfile = o.harnessProfile
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			stop()
			return nil, err
		}
		if o.profilePhase == "" {
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				stop()
				return nil, err
			}
			stops = append(stops, func() { f.Close() }, pprof.StopCPUProfile)
			return stop, nil
		}
		// One phase only: started as it begins, stopped as it ends (or when the run stops).
		var running bool
		cfg.OnPhase = chainPhase(cfg.OnPhase, func(name string, begin bool) {
			switch {
			case name != o.profilePhase:
			case begin && !running:
				if err := pprof.StartCPUProfile(f); err != nil {
					fmt.Fprintln(stderr, "-profile-phase:", err)
					return
				}
				running = true
			case !begin && running:
				pprof.StopCPUProfile()
				running = false
			}
		})
		stops = append(stops, func() {
			if running {
				pprof.StopCPUProfile()
			}
			f.Close()
		})
	}
	return stop, nil
}

// chainPhase calls first, then next, as each phase begins and ends (first may be nil).
func chainPhase(first, next func(name string, begin bool)) func(name string, begin bool) {
	if first == nil {
		return next
	}
	return func(name string, begin bool) {
		first(name, begin)
		next(name, begin)
	}
}

// startTrace arranges a runtime/trace of o.traceFor, starting o.traceAfter into the phase
// o.tracePhase (or when it ends, if that comes first: the window is then cut short). The
// connector runs in this process, so the one trace shows both sides of every socket: where an
// event waits (runnable but not running, GC assists, a blocked read or write, syscalls such as
// fdatasync). A whole phase would be gigabytes; a window of seconds is what go tool trace opens.
// stop ends a window still open and closes the file.
func (o *options) startTrace(cfg *loadtest.Config, stderr io.Writer) (stop func(), err error) {
	f, err := os.Create(o.traceOut)
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		running bool
		done    bool // the window was taken, or the phase ended: one window per run
		timer   *time.Timer
	)
	end := func() {
		mu.Lock()
		defer mu.Unlock()
		done = true // a window not begun yet never begins
		if timer != nil {
			timer.Stop()
		}
		if running {
			trace.Stop()
			running = false
		}
	}
	begin := func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		done = true
		if err := trace.Start(f); err != nil {
			fmt.Fprintln(stderr, "-trace:", err)
			return
		}
		running = true
		timer = time.AfterFunc(o.traceFor, end)
	}
	cfg.OnPhase = chainPhase(cfg.OnPhase, func(name string, starts bool) {
		if name != o.tracePhase {
			return
		}
		if !starts {
			end()
			return
		}
		mu.Lock()
		timer = time.AfterFunc(o.traceAfter, begin)
		mu.Unlock()
	})
	return func() {
		end()
		f.Close()
	}, nil
}

// buildConnector builds ./cmd/t3code-mcp into a temporary directory, which cleanup removes.
func buildConnector(ctx context.Context, stderr io.Writer) (bin string, cleanup func(), err error) {
	tmp, err := os.MkdirTemp("", "t3code-load-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	bin = filepath.Join(tmp, "t3code-mcp")
	fmt.Fprintln(stderr, "building ./cmd/t3code-mcp")
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", "build", "-o", bin, "./cmd/t3code-mcp")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build ./cmd/t3code-mcp: %w", err)
	}
	return bin, cleanup, nil
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
