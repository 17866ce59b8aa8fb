// Package loadtest is the load harness behind cmd/t3code-load: it runs the real connector binary
// (`t3code-mcp serve` as a child process, with a generated t3code.toml) against fake T3 machines
// (internal/t3fake) in its own process, with MCP clients (the go-sdk, streamable HTTP) and a local
// webhook receiver, and reports what it measured: start-up time, memory and CPU of the connector,
// end-to-end event latency, t3_wait wake-up latency, sustained transitions per second with the
// durable outbox, t3_thread on a large thread, and the push path against HTTP pollers.
//
// Everything listens on 127.0.0.1, every phase is bounded in time and count, and Run returns
// once it has stopped everything it started. docs/benchmarks.md has the figures and commands.
package loadtest

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Poller is one HTTP poller of the comparison: it reads each of its Runs' thread every Interval
// until the run has settled, as T3 MCP servers without a push path do.
type Poller struct {
	Interval time.Duration
	Runs     int
}

func (p Poller) String() string { return fmt.Sprintf("%s:%d", p.Interval, p.Runs) }

// ParsePollers reads "1s:200,30s:50".
func ParsePollers(s string) ([]Poller, error) {
	var out []Poller
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		iv, n, ok := strings.Cut(part, ":")
		d, err := time.ParseDuration(iv)
		var runs int
		if ok {
			_, err2 := fmt.Sscanf(n, "%d", &runs)
			err = errors.Join(err, err2)
		}
		if !ok || err != nil || d <= 0 || runs <= 0 {
			return nil, fmt.Errorf("poller %q: want interval:runs, e.g. 1s:200", part)
		}
		out = append(out, Poller{Interval: d, Runs: runs})
	}
	return out, nil
}

// Config is one load run. Zero values take the Full profile's value, except Binary.
type Config struct {
	// Binary is the t3code-mcp binary to run (go build ./cmd/t3code-mcp).
	Binary string
	// WorkDir holds the state directory, t3code.toml and connector.log; empty: a temporary
	// directory removed afterwards.
	WorkDir string

	Machines int // M: fake T3 machines under load
	Threads  int // T: threads per machine, all tracked and watched except the pollers'
	Waits    int // K: concurrent t3_wait calls in the latency phase

	Rate     float64       // E: settled runs per second in the latency phase
	PeakRate float64       // settled runs per second offered in the throughput phase
	Duration time.Duration // length of the latency and of the throughput phase
	// Script is the fake's script for rate-driven runs: "default" (seven steps, completed) or
	// "fail" (two steps, failed).
	Script string

	WaitsPerSession int // t3_wait calls per MCP session (the connector's default limit is 50)

	BigThreadItems int // turn items of the t3_thread thread (on one extra machine); <0: none
	ThreadCalls    int // t3_thread calls on it
	// ThreadFirst is how many more threads of BigThreadItems items the big machine holds, each
	// called once before the ThreadCalls calls: first calls, which read the thread from T3
	// whatever the connector keeps of threads it has shown (its t3_thread feeds); negative: none.
	ThreadFirst int
	// ThreadWarm warms the connector up before the first calls: t3_thread calls on a small
	// thread until its heap has settled (latency.go, warmHeap), so that the first calls are
	// measured on a heap that has cycled, as a connector's that has run for a while has. Off by
	// default: the first calls are then those right after start-up, when most pages a call
	// allocates are new to the kernel.
	ThreadWarm bool
	// ThreadControlPlane makes the big machine's thread reads carry an attempt and a node per run
	// as T3's do (t3fake.Options.ControlPlane): a body nearer T3's size for the same thread. On in
	// Full and Short since 12-02 03:05 (t3code-load -thread-control-plane=false: as before).
	ThreadControlPlane bool

	PushRuns  int           // comparison runs noticed through the connector (t3_wait + webhook)
	Pollers   []Poller      // comparison pollers
	RunLength time.Duration // comparison runs settle at uniformly random times within this

	// SeedRuns is how many finished runs every thread has before the connector starts (its
	// shell row then carries a latest run and a last visible message, as a used thread's does);
	// negative: none.
	SeedRuns int
	// NoHook runs without T3CODE_MCP_HOOK_URL: no events, so the wait path is measured alone.
	NoHook bool
	// LockStep starts every machine's rate-driven runs in the same driver tick (all machines'
	// pipelines in phase: at Rate R on M machines, M runs at once every M/R seconds), the
	// harness's way before 12-02 15:47 UTC (a66865d); by default each machine is offset by its share of the
	// period, so that runs arrive spread at the total rate (pipelinePhase).
	LockStep bool

	// The outage phase: the webhook receiver answers 503 for Outage while runs settle at
	// OutageRate on OutageThreads threads of each machine (a few threads each, so every thread
	// has several events queued and per-thread order is tested), then it comes back and the
	// drain of the backlog is measured, for at most OutageDrain.
	Outage        time.Duration
	OutageRate    float64
	OutageThreads int
	OutageDrain   time.Duration

	// The soak phase (only when named in Phases): runs at SoakRate on the watched threads and
	// SoakChurn new threads per second watched, unwatched and archived, for Soak, with the
	// connector's retentions set to SoakRetention; its memory and state file sampled every
	// SoakSample.
	Soak          time.Duration
	SoakRate      float64
	SoakChurn     float64
	SoakRetention time.Duration
	SoakSample    time.Duration

	// Compression is the `compression` key the harness writes into every machine's table of the
	// connector's t3code.toml: "" writes none (the connector's default, auto: a loopback machine
	// is read uncompressed), "gzip" measures the remote-machine case (the fakes gzip their larger
	// HTTP answers as T3 does, the connector inflates them), "none" and "auto" are written as
	// they are. The harness's own reads of the fakes (the thread phase's direct GET, the
	// comparison's pollers) ask for the same.
	Compression string

	Drain    time.Duration // the longest wait for deliveries after a phase
	KeepRuns int           // the fakes' KeepRuns (older runs leave a thread's projection)
	LogLevel string        // the connector's T3CODE_MCP_LOG_LEVEL
	Timeout  time.Duration // the whole run; default: computed from the phases

	// Progress receives one line per step; nil discards.
	Progress io.Writer

	// Phases to run, of thread, latency, compare, throughput, outage, soak (in that order);
	// empty: all but soak.
	Phases []string

	// DatabaseURL (postgres://…) runs the connector on PostgreSQL (T3CODE_MCP_DATABASE_URL)
	// instead of a bbolt file: the tracked threads are seeded there, the accounting reads it.
	// The database should be empty (a fresh one per run).
	DatabaseURL string
	// Replicas runs this many connectors on DatabaseURL (default 1): the first is the one the
	// agents talk to and whose CPU and memory are reported; the others detect the machines whose
	// leases they hold and deliver events like it.
	Replicas int
	// ReplicaEnv (KEY=VALUE) is added to the environment of every connector the harness starts
	// (each replica, the first included), after the harness's own settings, which it overrides:
	// T3CODE_MCP_LEASE_TTL=1500ms, T3CODE_MCP_CLAIM_TTL=10s, …
	ReplicaEnv []string

	// Split, when set, is the command line of the split harness's second process (t3code-load's
	// hidden subcommand harness-clients, which runs ServeClients): the webhook receiver and the
	// MCP clients run there, as other services would, and not in the process serving the fake
	// machines (remote.go). Empty: all in this process.
	Split []string
	// InProcess runs the connector inside this process instead of the binary, for profiling
	// (its CPU and memory figures then include the harness). Binary is not needed.
	InProcess bool
	// AfterStartup, when set, is called once the connector is synced and idle (a heap profile
	// of an in-process connector is taken here).
	AfterStartup func()
	// AtBacklog, when set, is called in the outage phase as the receiver comes back, with the
	// outbox at its fullest (a heap profile of an in-process connector under lag is taken here).
	AtBacklog func()
	// OnPhase, when set, is called as each phase begins (begin true) and ends (t3code-load's
	// -profile-phase starts and stops the CPU profile here, so that it holds one phase only).
	OnPhase func(name string, begin bool)
}

// Full is the profile of `make load`: the targets' scale.
func Full() Config {
	return Config{
		Machines: 100, Threads: 1000, Waits: 1000,
		Rate: 1000, PeakRate: 5000, Duration: 20 * time.Second, Script: "default",
		WaitsPerSession: 50, BigThreadItems: 5000, ThreadCalls: 50, ThreadFirst: 10, ThreadControlPlane: true,
		PushRuns: 200, Pollers: []Poller{{time.Second, 200}, {30 * time.Second, 50}}, RunLength: 60 * time.Second,
		Drain: 60 * time.Second, KeepRuns: 20, LogLevel: "info", SeedRuns: 1,
		// 60,000 events, the backlog of a 10-minute outage at 100/s, built ten times faster.
		Outage: 60 * time.Second, OutageRate: 1000, OutageThreads: 100, OutageDrain: 3 * time.Minute,
		Soak: 15 * time.Minute, SoakRate: 200, SoakChurn: 2, SoakRetention: 2 * time.Minute, SoakSample: 30 * time.Second,
	}
}

// Short is the CI profile (`make bench`, -short): the same phases, scaled down; the 30 s
// poller becomes a 5 s one so that the comparison fits in seconds.
func Short() Config {
	return Config{
		Machines: 4, Threads: 250, Waits: 100,
		Rate: 200, PeakRate: 1000, Duration: 5 * time.Second, Script: "default",
		WaitsPerSession: 50, BigThreadItems: 5000, ThreadCalls: 20, ThreadFirst: 5, ThreadControlPlane: true,
		PushRuns: 20, Pollers: []Poller{{time.Second, 20}, {5 * time.Second, 10}}, RunLength: 5 * time.Second,
		Drain: 30 * time.Second, KeepRuns: 20, LogLevel: "info", SeedRuns: 1,
		Outage: 10 * time.Second, OutageRate: 200, OutageThreads: 50, OutageDrain: time.Minute,
		Soak: 2 * time.Minute, SoakRate: 50, SoakChurn: 1, SoakRetention: 15 * time.Second, SoakSample: 5 * time.Second,
	}
}

// Tiny is the unit test's scenario: every phase, a few seconds in all.
func Tiny() Config {
	return Config{
		Machines: 2, Threads: 10, Waits: 4,
		Rate: 20, PeakRate: 50, Duration: time.Second, Script: "default",
		WaitsPerSession: 50, BigThreadItems: 50, ThreadCalls: 2, ThreadFirst: 2,
		PushRuns: 2, Pollers: []Poller{{200 * time.Millisecond, 2}}, RunLength: 500 * time.Millisecond,
		Drain: 10 * time.Second, KeepRuns: 20, LogLevel: "info", SeedRuns: 1,
		Outage: 2 * time.Second, OutageRate: 10, OutageThreads: 2, OutageDrain: 30 * time.Second,
		Soak: 6 * time.Second, SoakRate: 10, SoakChurn: 2, SoakRetention: time.Second, SoakSample: 500 * time.Millisecond,
	}
}

func (c Config) withDefaults() Config {
	f := Full()
	setI := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setF := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	setD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setI(&c.Machines, f.Machines)
	setI(&c.Threads, f.Threads)
	setI(&c.Waits, f.Waits)
	setF(&c.Rate, f.Rate)
	setF(&c.PeakRate, f.PeakRate)
	setD(&c.Duration, f.Duration)
	if c.Script == "" {
		c.Script = f.Script
	}
	setI(&c.WaitsPerSession, f.WaitsPerSession)
	setI(&c.BigThreadItems, f.BigThreadItems)
	setI(&c.ThreadCalls, f.ThreadCalls)
	setI(&c.ThreadFirst, f.ThreadFirst)
	if c.ThreadFirst < 0 {
		c.ThreadFirst = 0 // explicitly none
	}
	setI(&c.PushRuns, f.PushRuns)
	if c.Pollers == nil {
		c.Pollers = f.Pollers
	}
	setD(&c.RunLength, f.RunLength)
	setD(&c.Drain, f.Drain)
	setD(&c.Outage, f.Outage)
	setF(&c.OutageRate, f.OutageRate)
	setI(&c.OutageThreads, f.OutageThreads)
	setD(&c.OutageDrain, f.OutageDrain)
	setD(&c.Soak, f.Soak)
	setF(&c.SoakRate, f.SoakRate)
	setF(&c.SoakChurn, f.SoakChurn)
	setD(&c.SoakRetention, f.SoakRetention)
	setD(&c.SoakSample, f.SoakSample)
	setI(&c.SeedRuns, f.SeedRuns)
	if c.SeedRuns < 0 {
		c.SeedRuns = 0 // explicitly none
	}
	setI(&c.KeepRuns, f.KeepRuns)
	if c.LogLevel == "" {
		c.LogLevel = f.LogLevel
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Timeout == 0 {
		maxPoll := time.Duration(0)
		for _, p := range c.Pollers {
			maxPoll = max(maxPoll, p.Interval)
		}
		// Seeding and start-up scale with the thread count; each phase is bounded by its own
		// length plus a drain.
		setup := 2*time.Minute + time.Duration(c.Machines*c.Threads)*time.Millisecond
		c.Timeout = setup + 2*(c.Duration+c.Drain) + c.RunLength + maxPoll + c.Drain + 2*time.Minute
		if c.runs("outage") {
			c.Timeout += c.Outage + c.OutageDrain + time.Minute
		}
		if c.runs("soak") {
			c.Timeout += c.Soak + c.Drain + time.Minute
		}
	}
	return c
}

var allPhases = []string{"thread", "latency", "compare", "throughput", "outage", "soak"}

// PhaseNames are the phases, in the order they run.
var PhaseNames = slices.Clone(allPhases)

// runs says whether phase is to run: the soak runs only when asked for by name (it is long).
func (c Config) runs(phase string) bool {
	if len(c.Phases) == 0 {
		return phase != "soak"
	}
	return slices.Contains(c.Phases, phase)
}

func (c Config) validate() error {
	var errs []error
	if c.Binary == "" && !c.InProcess {
		errs = append(errs, errors.New("no connector binary (go build ./cmd/t3code-mcp)"))
	}
	if c.Machines < 1 || c.Threads < 1 || c.Waits < 0 || c.Rate < 0 || c.PeakRate < 0 || c.Duration < 0 ||
		c.Outage < 0 || c.OutageRate < 0 || c.OutageThreads < 0 || c.OutageDrain < 0 ||
		c.Soak < 0 || c.SoakRate < 0 || c.SoakChurn < 0 || c.SoakRetention < 0 || c.SoakSample < 0 {
		errs = append(errs, errors.New("machines and threads must be positive; waits, rates, durations and the outage's and soak's settings not negative"))
	}
	for _, p := range c.Phases {
		if !slices.Contains(allPhases, p) {
			errs = append(errs, fmt.Errorf("phase %q: want one of %v", p, allPhases))
		}
	}
	if !slices.Contains([]string{"", "auto", "gzip", "none"}, c.Compression) {
		errs = append(errs, fmt.Errorf("compression %q: want auto, gzip or none", c.Compression))
	}
	if _, ok := scriptSteps[c.Script]; !ok {
		errs = append(errs, fmt.Errorf("script %q: want default or fail", c.Script))
	}
	polled := 0
	for _, p := range c.Pollers {
		polled += p.Runs
	}
	reserved := c.Waits + c.PushRuns + polled
	if pipe := c.Machines*c.Threads - reserved; pipe < c.Machines {
		errs = append(errs, fmt.Errorf("%d machines × %d threads leave %d threads for rate-driven runs after %d waits, %d push and %d polled runs: want at least one per machine",
			c.Machines, c.Threads, pipe, c.Waits, c.PushRuns, polled))
	}
	sessions := (c.Waits + c.WaitsPerSession - 1) / c.WaitsPerSession
	if c.PushRuns > max(1, sessions)*c.WaitsPerSession {
		errs = append(errs, fmt.Errorf("%d push runs need more than the %d MCP sessions the waits open", c.PushRuns, sessions))
	}
	return errors.Join(errs...)
}
