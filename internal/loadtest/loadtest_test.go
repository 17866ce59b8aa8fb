package loadtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// fasthttp's worker pool (the webhook receiver's) has a cleaner goroutine that notices the
// server's stop only after its sleep of up to MaxIdleWorkerDuration (10 s) has ended.
func TestMain(m *testing.M) {
	if slices.Contains(os.Args[1:], clientsArg) { // TestTinyRun's split harness: its second process
		if err := ServeClients(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(removingBinary{m}, goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		// The in-process connector's webhook client (internal/outbox/post.go): ends by itself within
		// seconds of its last idle connection closing.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"))
}

// removingBinary runs the tests, then removes the binary buildConnector built.
type removingBinary struct{ m *testing.M }

func (r removingBinary) Run() int {
	code := r.m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	return code
}

var built struct {
	once     sync.Once
	dir, bin string
	err      error
	out      []byte
}

// buildConnector builds the real binary once for the package's tests (each build links anew, and
// on a fresh, loaded machine one build took more than 3 minutes). The bound is a safety net only.
func buildConnector(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "loadtest-bin-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "t3code-mcp")
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		built.out, built.err = exec.CommandContext(ctx, "go", "build", "-o", built.bin, "github.com/t3code-mcp/t3code-mcp/cmd/t3code-mcp").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build ./cmd/t3code-mcp: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// TestTinyRun runs every phase of the harness against the real binary at a tiny scale: 2
// machines × 10 threads, 4 waits, a few seconds; once in one process and once split (the
// receiver and the MCP clients in a second process, this test binary re-run as ServeClients:
// see TestMain). It checks that each phase produced its figures, that every transition is
// accounted for, none lost, and that the events queued during the receiver's outage all
// arrived, each thread's in order; it asserts nothing about how fast anything was.
func TestTinyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the connector binary")
	}
	bin := buildConnector(t)
	t.Run("one process", func(t *testing.T) { tinyRun(t, bin, nil) })
	t.Run("split", func(t *testing.T) { tinyRun(t, bin, splitArgs()) })
}

// splitArgs runs this test binary as the split harness's second process (TestMain).
func splitArgs() []string { return []string{os.Args[0], "-test.run=^$", clientsArg} }

// clientsArg, in this test binary's arguments, makes it the split harness's second process.
const clientsArg = "harness-clients"

func tinyRun(t *testing.T, bin string, split []string) {
	cfg := Tiny()
	cfg.Binary = bin
	cfg.Split = split
	cfg.ThreadWarm = len(split) > 0 // the warm-up in one of the two runs
	cfg.WorkDir = t.TempDir()
	cfg.Timeout = 2 * time.Minute
	var progress strings.Builder
	cfg.Progress = &progress
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	text := rep.Text()
	fail := func(format string, args ...any) {
		t.Helper()
		log, _ := os.ReadFile(filepath.Join(cfg.WorkDir, "connector.log"))
		t.Fatalf(format+"\nreport:\n%s\nprogress:\n%s\nconnector log (tail):\n%s", append(args, text, progress.String(), tail(string(log), 3000))...)
	}
	if rep.Startup.Threads != cfg.Machines*cfg.Threads+1+cfg.ThreadFirst || rep.Startup.Ready <= 0 || rep.Startup.IdleRSS <= 0 {
		fail("start-up: %+v", rep.Startup)
	}
	if tt := rep.ThreadTool; tt == nil || tt.Latency.N != cfg.ThreadCalls || tt.Items != cfg.BigThreadItems || tt.FirstLatency.N != cfg.ThreadFirst {
		fail("t3_thread: %+v", rep.ThreadTool)
	}
	// The warm-up ran where asked, in whole batches, and ended either settled after a collection
	// or at its cap.
	if w := rep.ThreadTool.Warm; cfg.ThreadWarm != (w != nil) ||
		w != nil && (w.Calls < warmBatch || w.Calls%warmBatch != 0 || w.Settled && w.GCCycles <= 0 || !w.Settled && w.Calls < warmMaxCalls && w.Wall < warmMaxWall) {
		fail("t3_thread warm-up (asked: %v): %+v", cfg.ThreadWarm, w)
	}
	l := rep.Latency
	if l == nil || l.ActiveWaits != cfg.Waits || l.Wake.N != cfg.Waits || l.MissingWake != 0 || l.Events.N == 0 || l.MissingEvent != 0 {
		fail("latency phase: %+v", l)
	}
	// The wakes' answers and the webhooks came with the kernel's receive stamps (in the split
	// child too; the kernel may leave a segment unstamped in a moment when stamps are being turned
	// on, so not necessarily every one), and a stamp is never after the harness read the bytes:
	// the slowest stamped one is at most the slowest read.
	if w, rx := l.Wake, l.WakeRx; rx.N == 0 || rx.N > w.N || rx.Max > w.Max || rx.P50 <= 0 {
		fail("wake at the socket: %+v against read %+v", rx, w)
	}
	if e, rx := l.Events, l.EventsRx; rx.N == 0 || rx.N > e.N || rx.Max > e.Max || rx.P50 <= 0 {
		fail("events at the socket: %+v against taken %+v", rx, e)
	}
	// The fakes wrote Chunks for the window's runs, and the harness's threads slept and were
	// woken meanwhile (harness_chunks, harness_wakeups).
	if u := l.Usage; u.HarnessChunks <= 0 || u.HarnessWakeups <= 0 {
		fail("latency phase usage: %d Chunks, %d wake-ups", u.HarnessChunks, u.HarnessWakeups)
	}
	if len(rep.Compare) != 2+len(cfg.Pollers) {
		fail("comparison: %+v", rep.Compare)
	}
	for _, a := range rep.Compare {
		if a.Noticed != a.Runs || a.Notice.N != a.Runs {
			fail("comparison %s: noticed %d of %d", a.Name, a.Noticed, a.Runs)
		}
	}
	if poll := rep.Compare[2]; poll.Requests < int64(poll.Runs) {
		fail("poller made %d requests for %d runs", poll.Requests, poll.Runs)
	}
	if rc := rep.Receiver; rc == nil || rc.Distinct == 0 || rc.Bad != 0 || rc.Refused == 0 {
		fail("receiver: %+v (want events, none bad, some refused during the outage)", rc)
	}
	if tp := rep.Throughput; tp == nil || tp.Settled <= 0 || tp.Delivered <= 0 {
		fail("throughput phase: %+v", tp)
	}
	// The connector's kernel time is counted in each window, as a part of its CPU; over windows
	// of socket work that took it a tenth of a second or more, some of it was the kernel's (10 ms
	// ticks, each counted as user or kernel time).
	// Its minor page faults too: a Go process that works for a tenth of a second allocates pages
	// the kernel has not mapped for it yet.
	var cpu, sys time.Duration
	var faults int64
	for _, u := range []Usage{l.Usage, rep.ThreadTool.Usage, rep.Throughput.Usage} {
		if u.SysCPU < 0 || u.SysCPU > u.CPU || u.MinorFaults < 0 {
			fail("a window's connector CPU %s with %s of it in the kernel, %d minor faults", u.CPU, u.SysCPU, u.MinorFaults)
		}
		cpu, sys, faults = cpu+u.CPU, sys+u.SysCPU, faults+u.MinorFaults
	}
	if cpu >= 100*time.Millisecond && (sys <= 0 || faults <= 0) {
		fail("the connector's CPU over the latency, t3_thread and throughput windows: %s, %s of it in the kernel, %d minor faults", cpu, sys, faults)
	}
	if rep.ThreadTool.FirstFaultsPerCall < 0 {
		fail("t3_thread first calls: %.1f minor faults per call", rep.ThreadTool.FirstFaultsPerCall)
	}
	if o := rep.Outage; o == nil || o.Settled == 0 || o.Refused == 0 || o.Backlog < o.Settled || o.Delivered != o.Settled || o.Undelivered != 0 || o.OrderBroken != 0 || o.OrderChecked == 0 {
		fail("outage phase: %+v", o)
	}
	if len(rep.Accounting) != 4 {
		fail("accounting: %+v", rep.Accounting)
	}
	for _, a := range rep.Accounting {
		if a.Settled == 0 || a.Delivered+a.Pending+a.Lost != a.Settled || a.Lost != 0 {
			fail("accounting %s: %+v", a.Phase, a)
		}
	}
	if (len(split) > 0) != (l.Usage.ClientsCPU > 0) {
		fail("the second process's CPU: %s (split %v)", l.Usage.ClientsCPU, split)
	}
	if rep.PeakRSSKB <= 0 || rep.TotalCPU <= 0 {
		fail("connector usage: peak RSS %d kB, CPU %s", rep.PeakRSSKB, rep.TotalCPU)
	}
	for _, want := range []string{"start-up", "t3_thread", "latency", "compare", "throughput", "outage", "peak RSS"} {
		if !strings.Contains(text, want) {
			fail("report lacks %q", want)
		}
	}
}

// runTiny runs the harness at the tiny scale against the built binary, with the config changed
// by set; a failed run fails the test.
func runTiny(t *testing.T, set func(*Config)) (Config, *Report, *strings.Builder) {
	t.Helper()
	cfg := Tiny()
	set(&cfg)
	cfg.Binary = buildConnector(t)
	cfg.WorkDir = t.TempDir()
	cfg.Timeout = 2 * time.Minute
	progress := &strings.Builder{}
	cfg.Progress = progress
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	return cfg, rep, progress
}

// TestTinySoak runs the soak phase alone for a few seconds with a one-second retention: it
// checks that the connector was sampled, that threads were churned through t3_watch and that
// every soak run's event arrived; whether memory stayed flat is for the long run to say.
func TestTinySoak(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the connector binary")
	}
	cfg, rep, progress := runTiny(t, func(cfg *Config) { cfg.Phases = []string{"soak"} })
	s := rep.Soak
	fail := func(format string, args ...any) {
		t.Helper()
		log, _ := os.ReadFile(filepath.Join(cfg.WorkDir, "connector.log"))
		t.Fatalf(format+"\nreport:\n%s\nprogress:\n%s\nconnector log (tail):\n%s", append(args, rep.Text(), progress.String(), tail(string(log), 3000))...)
	}
	if s == nil || len(s.Samples) < 2 || s.Retention != cfg.SoakRetention || s.PruneInterval != time.Second {
		fail("soak: %+v", s)
	}
	for _, x := range s.Samples {
		if x.RSSKB <= 0 || x.StateFileKB <= 0 || x.Watched < rep.Startup.Watched {
			fail("soak sample %+v: want RSS, a state file and every seeded thread watched", x)
		}
	}
	if s.Churned == 0 || s.ChurnErrors != 0 {
		fail("soak churned %d threads, %d failed", s.Churned, s.ChurnErrors)
	}
	if s.Settled == 0 || s.Delivered != s.Settled {
		fail("soak: %d runs settled, %d delivered", s.Settled, s.Delivered)
	}
	if !strings.Contains(rep.Text(), "soak") || !strings.Contains(rep.Config, "retention 1s") {
		fail("the report does not describe the soak")
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestParsePollers(t *testing.T) {
	p, err := ParsePollers("1s:200, 30s:50")
	if err != nil || len(p) != 2 || p[0] != (Poller{time.Second, 200}) || p[1] != (Poller{30 * time.Second, 50}) {
		t.Fatalf("ParsePollers = %v, %v", p, err)
	}
	for _, bad := range []string{"1s", "x:1", "1s:0", "-1s:3", "1s:x"} {
		if _, err := ParsePollers(bad); err == nil {
			t.Errorf("ParsePollers(%q) accepted", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	c := Tiny().withDefaults()
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Fatalf("no binary: %v", err)
	}
	c.Binary = "x"
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	c.Waits = 100
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "leave") {
		t.Fatalf("too few threads: %v", err)
	}
}

func TestDist(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	d := dist(ds)
	if d.N != 100 || d.P50 != 50*time.Millisecond || d.P99 != 99*time.Millisecond || d.Max != 100*time.Millisecond || d.Mean != 50500*time.Microsecond {
		t.Fatalf("dist = %+v", d)
	}
	if z := dist(nil); z.N != 0 || z.String() != "no samples" {
		t.Fatalf("empty dist = %+v", z)
	}
}

// TestTinyCompareAlone runs the comparison phase alone: the first phase to release runs with
// run.interrupt. The harness's own command sockets are dialed at set-up, so the requests the
// phase counts as the connector's (the t3_wait approach's by_route) hold no ticket and no
// WebSocket upgrade of the harness's; before 12-02 one of each per machine fell into the window.
func TestTinyCompareAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the connector binary")
	}
	_, rep, progress := runTiny(t, func(cfg *Config) { cfg.Phases = []string{"compare"} })
	if len(rep.Compare) == 0 {
		t.Fatalf("no comparison\nprogress:\n%s", progress.String())
	}
	for _, a := range rep.Compare {
		if a.Noticed != a.Runs {
			t.Errorf("comparison %s: noticed %d of %d", a.Name, a.Noticed, a.Runs)
		}
	}
	for route, n := range rep.Compare[0].ByRoute {
		if route == "GET /ws" || strings.Contains(route, "websocket-ticket") {
			t.Errorf("the window's requests count %d × %s: the harness's own command sockets were dialed in it", n, route)
		}
	}
}

// TestTinyReplicas runs the throughput phase at the tiny scale on PostgreSQL with two replicas of
// the binary, each given -replica-env settings: both replicas start with them (their logs say so),
// the phase drains (nothing pending, no look-up left on either replica) and no settled run is
// lost.
func TestTinyReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the connector binary")
	}
	cfg, rep, progress := runTiny(t, func(cfg *Config) {
		cfg.DatabaseURL = pgtest.New(t)
		cfg.Replicas = 2
		cfg.ReplicaEnv = []string{"T3CODE_MCP_CLAIM_TTL=17s", "T3CODE_MCP_LEASE_TTL=2500ms"}
		cfg.Phases = []string{"throughput"}
	})
	logs, _ := filepath.Glob(filepath.Join(cfg.WorkDir, "*", "connector.log"))
	logs = append(logs, filepath.Join(cfg.WorkDir, "connector.log"))
	started := 0
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "lease_ttl=2.5s claim_ttl=17s") {
			started++
		}
	}
	if started != cfg.Replicas {
		t.Errorf("%d of %d replicas logged the -replica-env settings (logs %v)", started, cfg.Replicas, logs)
	}
	tp := rep.Throughput
	if tp == nil || tp.Settled <= 0 || tp.Drained <= 0 || tp.Left != 0 {
		t.Fatalf("throughput phase: %+v\n%s\nprogress:\n%s", tp, rep.Text(), progress.String())
	}
	if len(rep.Accounting) == 0 {
		t.Fatal("no accounting")
	}
	for _, a := range rep.Accounting {
		if a.Lost != 0 || a.Pending != 0 || a.Delivered != a.Settled {
			t.Errorf("accounting: %+v", a)
		}
	}
}

// The t3code.toml the harness writes carries -compression into every machine's table, as the
// connector's own parser reads it, and leaves the key out (the connector's auto) by default.
func TestWriteConfigCompression(t *testing.T) {
	var machines []*machine
	for i := range 2 {
		m, err := newMachine(i, fmt.Sprintf("m%d", i), t3fake.Options{}, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.fk.Close)
		machines = append(machines, m)
	}
	for compression, want := range map[string]string{"": config.CompressionAuto, "gzip": config.CompressionGzip, "none": config.CompressionNone} {
		path := filepath.Join(t.TempDir(), "t3code.toml")
		if err := writeConfig(path, machines, compression); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Machines) != len(machines) {
			t.Fatalf("compression %q: %d machines", compression, len(cfg.Machines))
		}
		for _, m := range cfg.Machines {
			if m.Compression != want {
				t.Errorf("compression %q: machine %s has %q, want %q", compression, m.Name, m.Compression, want)
			}
		}
	}
	c := Tiny().withDefaults()
	c.Binary, c.Compression = "x", "brotli"
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "compression") {
		t.Errorf("compression brotli: %v", err)
	}
}
