package loadtest

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Dist summarizes a set of durations.
type Dist struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
}

func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	// Nearest rank.
	rank := func(p float64) time.Duration {
		i := int(float64(len(s))*p+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Dist{N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1], Mean: sum / time.Duration(len(s))}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func (d Dist) String() string {
	if d.N == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s  p99 %s  max %s  mean %s  (n=%d)", ms(d.P50), ms(d.P99), ms(d.Max), ms(d.Mean), d.N)
}

// Host describes the machine the run happened on.
type Host struct {
	CPUs     int    `json:"cpus"`
	Model    string `json:"model"`
	MemTotal string `json:"mem_total"`
	Go       string `json:"go"`
	// Damon is the state of the guest's memory monitor's workers at the start ("on", "off",
	// several joined by commas; "" none): damon.go.
	Damon string `json:"damon"`
}

func host() Host {
	h := Host{CPUs: runtime.NumCPU(), Go: runtime.Version(), Damon: damonStates("/sys")}
	scan := func(path string, f func(k, v string)) {
		fh, err := os.Open(path)
		if err != nil {
			return
		}
		defer fh.Close()
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok {
				f(strings.TrimSpace(k), strings.TrimSpace(v))
			}
		}
	}
	scan("/proc/cpuinfo", func(k, v string) {
		if k == "model name" && h.Model == "" {
			h.Model = v
		}
	})
	scan("/proc/meminfo", func(k, v string) {
		if k == "MemTotal" {
			h.MemTotal = v
		}
	})
	return h
}

// Usage is the connector's resources over a window.
type Usage struct {
	Wall time.Duration `json:"wall_ns"`
	CPU  time.Duration `json:"cpu_ns"` // utime+stime
	// SysCPU is the part of CPU in the kernel (stime): the connector's socket reads and writes,
	// poller and futex wake-ups, page faults. In 10 ms ticks, as CPU is.
	SysCPU time.Duration `json:"sys_cpu_ns"`
	// MinorFaults is the connector's minor page faults over the window: pages it touched that
	// the kernel had to map (memory new to the process, or returned to the OS and taken again).
	MinorFaults int64   `json:"minor_faults"`
	Cores       float64 `json:"cores"` // CPU / Wall
	MaxRSSKB    int64   `json:"max_rss_kb"`
	// HarnessCores is the harness process (fake T3 machines, MCP clients, receiver, pollers)
	// over the same window: it shares the machine's cores with the connector.
	HarnessCores float64 `json:"harness_cores"`
	LoadAvg      string  `json:"loadavg"` // 1-minute load average at the end (other work on the machine counts)
	// HarnessCPU is the harness process's CPU (utime+stime) over the window, and HarnessFaults
	// its minor page faults: memory it touched for the first time, which on this machine costs
	// more than most of its work.
	HarnessCPU    time.Duration `json:"harness_cpu_ns"`
	HarnessFaults int64         `json:"harness_minor_faults"`
	// The harness's garbage collection over the window (runtime/metrics; with the connector
	// in-process, the process's): the runtime's estimate of the CPU it spent collecting (mark
	// workers, assists, pauses), the cycles completed, and the live heap at the end (the last
	// cycle's marked heap: mostly the fakes' state, which every cycle marks).
	HarnessGCCPU      time.Duration `json:"harness_gc_cpu_ns"`
	HarnessGCCycles   int64         `json:"harness_gc_cycles"`
	HarnessHeapLiveKB int64         `json:"harness_heap_live_kb"`
	// HarnessChunks is the Chunks the fake machines wrote over the window (shell and thread
	// streams, every machine): the unit of the fakes' socket work, so HarnessCPU per Chunk
	// compares harness builds where CPU per run moves with how many items a Chunk carries.
	// HarnessWakeups is the harness process's voluntary context switches meanwhile
	// (getrusage ru_nvcsw, every thread): an OS thread that went to sleep for want of work,
	// each paid again when a goroutine hand-off wakes one.
	HarnessChunks  int64 `json:"harness_chunks"`
	HarnessWakeups int64 `json:"harness_wakeups"`
	// ClientsCPU is, in the split harness (t3code-load -split), the CPU of its second process
	// (the webhook receiver and the MCP clients), included in HarnessCPU and HarnessCores; 0 in
	// one process. The other harness_ figures (faults, GC, wake-ups) are the first process's.
	ClientsCPU time.Duration `json:"harness_clients_cpu_ns"`
	// KdamondCPU is the CPU the guest's memory monitor's kernel threads (DAMON's kdamond) took
	// over the window: another tenant of the cores (damon.go).
	KdamondCPU time.Duration `json:"kdamond_cpu_ns"`
}

func (u Usage) String() string {
	split := ""
	if u.ClientsCPU > 0 && u.Wall > 0 {
		split = fmt.Sprintf(", %.2f of them its receiver's and clients' process", u.ClientsCPU.Seconds()/u.Wall.Seconds())
	}
	monitor := ""
	if u.KdamondCPU > 0 && u.Wall > 0 {
		monitor = fmt.Sprintf("; the memory monitor (kdamond) %.2f cores", u.KdamondCPU.Seconds()/u.Wall.Seconds())
	}
	return fmt.Sprintf("CPU %.2f s (%.2f s of it in the kernel, %d minor page faults) over %.1f s (%.2f cores), max RSS %.1f MB; the harness used %.2f cores meanwhile%s (%d minor page faults; GC %.2f s in %d cycles, live heap %.0f MB; %d Chunks written, %d wake-ups)%s; load average %s",
		u.CPU.Seconds(), u.SysCPU.Seconds(), u.MinorFaults, u.Wall.Seconds(), u.Cores, float64(u.MaxRSSKB)/1024, u.HarnessCores, split, u.HarnessFaults,
		u.HarnessGCCPU.Seconds(), u.HarnessGCCycles, float64(u.HarnessHeapLiveKB)/1024, u.HarnessChunks, u.HarnessWakeups, monitor, u.LoadAvg)
}

// Startup is the connector's start.
type Startup struct {
	SeedTime time.Duration `json:"seed_ns"`  // creating every thread in the fakes
	Ready    time.Duration `json:"ready_ns"` // exec → /healthz ok with every machine online
	Synced   time.Duration `json:"synced_ns"`
	IdleRSS  int64         `json:"idle_rss_kb"` // after sync and a pause
	// Where the idle RSS is: anonymous memory (Go heap and runtime) and file pages (the bbolt
	// mmap, the binary); and the Go heap from the connector's /metrics.
	RssAnonKB    int64 `json:"rss_anon_kb"`
	RssFileKB    int64 `json:"rss_file_kb"`
	HeapInuseKB  int64 `json:"heap_inuse_kb"`
	HeapRetainKB int64 `json:"heap_retained_kb"` // idle heap not yet returned to the OS
	NextGCKB     int64 `json:"next_gc_kb"`
	StateFileKB  int64 `json:"state_file_kb"`
	Threads      int   `json:"threads"` // threads tracked by the connector's watchers
	Watched      int   `json:"watched"` // of which tracked and watched in its state file
}

// ThreadTool is t3_thread on the big thread.
type ThreadTool struct {
	Items int `json:"items"`
	Bytes int `json:"bytes"` // the thread's GET body
	// BoundedBytes is the body of GET …/threads/{id}/bounded, the read t3_thread makes.
	BoundedBytes int   `json:"bounded_bytes"`
	Latency      Dist  `json:"latency"` // t3_thread through MCP
	Direct       Dist  `json:"direct"`  // the same GET straight from the fake T3, body read, not decoded
	Usage        Usage `json:"usage"`   // the connector during the t3_thread calls
	// CPUPerCall is the connector's CPU (utime+stime) per t3_thread call on the thread: its first
	// call and the repeated ones (Latency) together.
	CPUPerCall time.Duration `json:"cpu_per_call_ns"`

	// First and repeated calls apart (added 12-01 night): a connector that keeps the threads it
	// has shown current (t3_thread's feeds) reads only on a thread's first call, so a mean over
	// both says little about either.
	//
	// FirstLatency is the first call on each of the other -thread-first threads (as many items),
	// FirstCPUPerCall the connector's CPU over those calls and the second after them (what the
	// calls left running, such as a subscription's snapshot) per call.
	FirstLatency    Dist          `json:"first_latency"`
	FirstCPUPerCall time.Duration `json:"first_cpu_per_call_ns"`
	// FirstSysPerCall is the kernel's part of it (stime over the same window, per call; counted
	// in 10 ms ticks, so ±0.25 ms per call over 40 calls): receiving T3's bounded body, the
	// poller's and the goroutines' wake-ups. On this machine it is the part that swings from run
	// to run (docs/benchmarks.md, "The first call's CPU: half of it in the kernel").
	FirstSysPerCall time.Duration `json:"first_sys_per_call_ns"`
	// FirstFaultsPerCall is the connector's minor page faults over the same window, per call: pages
	// the connector touched that the kernel had to map anew. Right after start-up nearly every
	// page a call allocates is one (the connector has returned its free memory to the OS once the
	// machines' snapshots were in, internal/watch/gate.go); on this guest each costs tens of µs
	// of kernel time (docs/benchmarks.md, "The first call's kernel time: page faults").
	FirstFaultsPerCall float64 `json:"first_faults_per_call"`
	// Warm is the warm-up before the first calls (t3code-load -thread-warm); absent without it.
	Warm *ThreadWarm `json:"warm,omitempty"`
	// RepeatCPUPerCall is the connector's CPU per repeated call on the thread (Latency's calls),
	// from the end of its first call on.
	RepeatCPUPerCall time.Duration `json:"repeat_cpu_per_call_ns"`
	// FirstSources counts the first calls' results by where the connector took them from (its
	// t3code_mcp_thread_results_total{source}: "feed", "read"), Sources the results of the calls
	// on the thread (its first and the repeated ones); absent when the connector does not count
	// them. (Scraped outside the CPU windows.)
	FirstSources map[string]int64 `json:"first_sources,omitempty"`
	Sources      map[string]int64 `json:"sources,omitempty"`
}

// ThreadWarm is the thread phase's warm-up (t3code-load -thread-warm): t3_thread calls on a
// small thread until the connector's heap had settled (latency.go, warmHeap), so that the first
// calls after it are measured on a connector whose heap has cycled, as one's that has run for a
// while has, instead of on the pages its start-up returned to the OS.
type ThreadWarm struct {
	Calls    int   `json:"calls"`
	GCCycles int64 `json:"gc_cycles"` // the connector's collections meanwhile (go_gc_duration_seconds_count)
	// Settled: the warm-up ended because the heap had settled (a collection, then a batch of calls
	// with fewer minor faults than calls); false: the cap (10,000 calls or 60 s) came first.
	Settled     bool          `json:"settled"`
	Wall        time.Duration `json:"wall_ns"`
	MinorFaults int64         `json:"minor_faults"` // the connector's, during the warm-up
}

// Latency is the latency phase.
type Latency struct {
	Offered float64 `json:"offered_per_s"`
	Settled float64 `json:"settled_per_s"` // runs that settled in T3 per second, pipeline and waits
	Events  Dist    `json:"event_latency"` // T3 frame sent → webhook received
	// EventsRx is Events ending when the webhook's last bytes reached the receiver's socket, by
	// the kernel's receive stamp (rxstamp.go). Empty when the kernel stamped none.
	EventsRx Dist `json:"event_rx_latency"`
	Wake     Dist `json:"wake_latency"` // first T3 frame showing the settle (shell row or thread stream) sent → t3_wait result received
	// WakeRx is Wake ending when the result's last bytes reached the client's socket, by the
	// kernel's receive stamp (rxstamp.go), not when the client had read them: the same wakes
	// without the harness's own wait for a core. Empty when the kernel stamped none.
	WakeRx       Dist  `json:"wake_rx_latency"`
	MissingEvent int   `json:"missing_events"`
	MissingWake  int   `json:"missing_wakes"`
	EarlyWakes   int   `json:"early_wakes"` // waits re-issued: they returned before their run settled
	ActiveWaits  int   `json:"active_waits"`
	Usage        Usage `json:"usage"`
	Skipped      int   `json:"skipped"`
	Behind       int   `json:"behind"` // offered runs the harness's fakes could not start in time
	// Stages are the connector's duration histograms over the phase and its drain (where an
	// event's and a wake-up's time goes).
	Stages []Stage `json:"stages,omitempty"`
}

// Throughput is the throughput phase.
type Throughput struct {
	Offered   float64       `json:"offered_per_s"`
	Settled   float64       `json:"settled_per_s"`   // runs settled in T3
	Committed float64       `json:"committed_per_s"` // events made durable in the outbox
	Delivered float64       `json:"delivered_per_s"` // events received by the webhook
	Backlog   int           `json:"backlog"`         // pending in the outbox at the end of the window
	Drained   time.Duration `json:"drained_ns"`      // time to deliver the backlog (0: not within Drain)
	Left      int           `json:"left"`            // still pending after Drain
	Events    Dist          `json:"event_latency"`
	Dropped   int           `json:"dropped"` // offered runs not started because the connector lagged
	Skipped   int           `json:"skipped"`
	Behind    int           `json:"behind"` // offered runs the harness's fakes could not start in time
	Usage     Usage         `json:"usage"`
	// HarnessPerRun is the harness's CPU per run settled in the window (Usage.HarnessCPU over
	// Settled × the window): what driving one run costs the fakes, clients and receiver together.
	HarnessPerRun time.Duration `json:"harness_cpu_per_run_ns"`
	Stages        []Stage       `json:"stages,omitempty"` // as Latency.Stages
}

// Outage is the outage phase: the webhook receiver down while runs settle, then the drain.
type Outage struct {
	Down          time.Duration `json:"down_ns"`          // how long the receiver answered 503
	Offered       float64       `json:"offered_per_s"`    // runs per second offered while it was down
	Threads       int           `json:"threads"`          // pipeline threads the runs went to
	Settled       int           `json:"settled"`          // watched runs that settled in T3 while it was down
	PendingBefore int           `json:"pending_before"`   // the outbox's pending count before the phase
	Backlog       int           `json:"backlog"`          // the outbox's pending count when the receiver came back
	CommitWait    time.Duration `json:"commit_wait_ns"`   // from the end of the outage until the backlog held every settled run
	Refused       int64         `json:"refused"`          // deliveries answered 503 while down
	Drained       time.Duration `json:"drained_ns"`       // receiver back → every event of the phase received (0: not within the limit)
	DrainRate     float64       `json:"drain_per_s"`      // backlog / drained
	Delivered     int           `json:"delivered"`        // of Settled, received by the end of the drain
	Undelivered   int           `json:"undelivered"`      // of Settled, not received by the end of the drain
	OrderChecked  int           `json:"threads_checked"`  // threads with two or more events received
	OrderBroken   int           `json:"order_violations"` // threads whose events arrived out of settling order
	DownUsage     Usage         `json:"usage_down"`       // the connector while the receiver was down
	DrainUsage    Usage         `json:"usage_drain"`      // the connector while the backlog drained
}

// Approach is one way of noticing that runs settled.
type Approach struct {
	Name        string           `json:"name"`
	Runs        int              `json:"runs"`
	Noticed     int              `json:"noticed"`
	Notice      Dist             `json:"time_to_notice"` // settling step in T3 → noticed
	Requests    int64            `json:"http_requests"`  // HTTP requests to the T3 machines
	PerRun      float64          `json:"http_requests_per_run"`
	ByRoute     map[string]int64 `json:"by_route,omitempty"`
	NoticeRatio float64          `json:"notice_ratio"`   // mean time-to-notice / the push path's
	RequestX    float64          `json:"requests_ratio"` // requests per run / the push path's
}

// Accounting is what became of the transitions of one phase, read from the state file after the
// connector stopped.
type Accounting struct {
	Phase     string `json:"phase"`
	Settled   int    `json:"settled"`   // watched runs that settled in T3
	Delivered int    `json:"delivered"` // their webhook arrived
	Pending   int    `json:"pending"`   // recorded in the outbox, not delivered at the end
	Lost      int    `json:"lost"`      // never recorded by the connector
}

// Receiver is what the webhook receiver took over the whole run (added 12-01 evening): every
// delivery it answered is one of these.
type Receiver struct {
	Distinct   int   `json:"distinct"`   // events received (first delivery of each event id)
	Duplicates int   `json:"duplicates"` // deliveries of an event id already received
	Bad        int   `json:"bad"`        // bodies that did not decode, had no id, or whose id the webhook-id header did not repeat
	Refused    int64 `json:"refused"`    // deliveries answered 503 while it was down (the outage phase)
	// Connections the connector opened to the receiver over the run (added 12-02): each one a
	// connect and an accept on the way of the event it carried first.
	Connections int64 `json:"connections"`
}

// Report is everything one run measured.
type Report struct {
	Date       time.Time     `json:"date"`
	Host       Host          `json:"host"`
	Config     string        `json:"config"`
	Startup    Startup       `json:"startup"`
	ThreadTool *ThreadTool   `json:"thread_tool,omitempty"`
	Latency    *Latency      `json:"latency,omitempty"`
	Compare    []Approach    `json:"compare,omitempty"`
	Throughput *Throughput   `json:"throughput,omitempty"`
	Outage     *Outage       `json:"outage,omitempty"`
	Soak       *Soak         `json:"soak,omitempty"`
	Accounting []Accounting  `json:"accounting,omitempty"`
	Receiver   *Receiver     `json:"receiver,omitempty"`
	PeakRSSKB  int64         `json:"peak_rss_kb"` // VmHWM at the end
	TotalCPU   time.Duration `json:"total_cpu_ns"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	Warnings   []string      `json:"warnings,omitempty"`
}

func mb(kb int64) string { return fmt.Sprintf("%.1f MB", float64(kb)/1024) }

// Text renders the report for people.
func (r *Report) Text() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("t3code-load  %s", r.Date.UTC().Format(time.RFC3339))
	p("host: %d CPUs, %s, %s memory, %s", r.Host.CPUs, r.Host.Model, r.Host.MemTotal, r.Host.Go)
	if r.Host.Damon != "" {
		p("host: the guest's memory monitor (DAMON) is %s", r.Host.Damon)
	}
	p("config: %s", r.Config)
	p("")
	s := r.Startup
	p("start-up   %d threads tracked by the watchers (%d watched), seeded in %.1f s", s.Threads, s.Watched, s.SeedTime.Seconds())
	p("           /healthz ready (all machines online) after %s; snapshots acknowledged after %s", ms(s.Ready), ms(s.Synced))
	p("           RSS once synced and idle: %s (anonymous %s, file-backed %s; Go heap in use %s, idle not returned %s, next GC at %s; state file %s)",
		mb(s.IdleRSS), mb(s.RssAnonKB), mb(s.RssFileKB), mb(s.HeapInuseKB), mb(s.HeapRetainKB), mb(s.NextGCKB), mb(s.StateFileKB))
	if t := r.ThreadTool; t != nil {
		p("t3_thread  %d-item thread (%.1f MiB; its bounded read %.1f MiB): %s", t.Items, float64(t.Bytes)/(1<<20), float64(t.BoundedBytes)/(1<<20), t.Latency)
		p("           the fake T3's GET of it alone:  %s", t.Direct)
		p("           connector: %s; %s CPU per call", t.Usage, ms(t.CPUPerCall))
		if t.FirstLatency.N > 0 {
			if w := t.Warm; w != nil {
				p("           warm-up: %d calls on a small thread in %.1f s, %d collections by the connector, %d minor faults; settled %v", w.Calls, w.Wall.Seconds(), w.GCCycles, w.MinorFaults, w.Settled)
			}
			p("           first calls (one on each of %d other threads): %s; %s CPU per call (%s of it in the kernel, %.1f minor faults)%s", t.FirstLatency.N, t.FirstLatency, ms(t.FirstCPUPerCall), ms(t.FirstSysPerCall), t.FirstFaultsPerCall, sources(t.FirstSources))
		}
		p("           repeated calls on the thread: %s CPU per call", ms(t.RepeatCPUPerCall))
		if len(t.Sources) > 0 {
			p("           the thread's %d calls (its first and the repeated)%s", t.Latency.N+1, sources(t.Sources))
		}
	}
	if l := r.Latency; l != nil {
		p("latency    offered %.0f runs/s, settled %.0f/s; %d t3_wait blocked at once", l.Offered, l.Settled, l.ActiveWaits)
		p("           event (T3 frame sent → webhook received): %s", l.Events)
		if l.EventsRx.N > 0 {
			p("           event (… → webhook at the receiver's socket): %s", l.EventsRx)
		}
		p("           wake  (T3 frame sent → t3_wait result):   %s", l.Wake)
		if l.WakeRx.N > 0 {
			p("           wake  (… → result at the client's socket): %s", l.WakeRx)
		}
		if l.MissingEvent+l.MissingWake+l.EarlyWakes+l.Skipped+l.Behind > 0 {
			p("           events not delivered within the phase and its drain %d, missing wakes %d, waits re-issued %d, runs not started: no idle thread %d, harness behind %d",
				l.MissingEvent, l.MissingWake, l.EarlyWakes, l.Skipped, l.Behind)
		}
		p("           connector: %s", l.Usage)
		stagesText(p, l.Stages)
	}
	if len(r.Compare) > 0 {
		p("compare    time to notice a settled run (from T3's settling step) and HTTP requests to T3 per run:")
		for _, a := range r.Compare {
			p("           %-26s runs %4d noticed %4d  %s", a.Name, a.Runs, a.Noticed, a.Notice)
			p("           %-26s %.2f requests/run (%d)  ×%.1f time to notice, ×%.1f requests of the push path", "", a.PerRun, a.Requests, a.NoticeRatio, a.RequestX)
		}
	}
	if t := r.Throughput; t != nil {
		p("throughput offered %.0f runs/s: settled %.0f/s, committed (fsynced outbox) %.0f/s, delivered %.0f/s", t.Offered, t.Settled, t.Committed, t.Delivered)
		drained := "not within the drain limit"
		if t.Drained > 0 {
			drained = fmt.Sprintf("drained in %.1f s", t.Drained.Seconds())
		}
		p("           backlog %d at the end (%s, %d left); runs not started: connector lagging %d, no idle thread %d, harness behind %d",
			t.Backlog, drained, t.Left, t.Dropped, t.Skipped, t.Behind)
		p("           event latency: %s", t.Events)
		p("           connector: %s", t.Usage)
		p("           harness: %.1f µs CPU per settled run", float64(t.HarnessPerRun)/float64(time.Microsecond))
		stagesText(p, t.Stages)
	}
	if o := r.Outage; o != nil {
		p("outage     receiver down %.1f s at %.0f runs/s offered on %d threads: %d runs settled, %d deliveries refused; backlog %d (%d before)",
			o.Down.Seconds(), o.Offered, o.Threads, o.Settled, o.Refused, o.Backlog, o.PendingBefore)
		drained := fmt.Sprintf("not drained within the limit: %d of %d received", o.Delivered, o.Settled)
		if o.Drained > 0 {
			drained = fmt.Sprintf("drained in %.1f s (%.0f events/s)", o.Drained.Seconds(), o.DrainRate)
		}
		p("           receiver back: %s; %d undelivered; per-thread order broken on %d of %d threads checked", drained, o.Undelivered, o.OrderBroken, o.OrderChecked)
		p("           connector while down: %s", o.DownUsage)
		p("           connector while draining: %s", o.DrainUsage)
	}
	if s := r.Soak; s != nil {
		p("soak       %.0f runs/s for %s with retention %s (pruned every %s): %d runs settled, %d delivered; %d threads watched, dropped and archived (%d failed)",
			s.Offered, s.Duration, s.Retention, s.PruneInterval, s.Settled, s.Delivered, s.Churned, s.ChurnErrors)
		p("           %8s %10s %10s %11s %8s %8s %8s %10s %6s", "t", "RSS", "heap", "state file", "tracked", "watched", "pending", "goroutines", "load")
		for _, x := range s.Samples {
			p("           %7.0fs %10s %10s %11s %8d %8d %8d %10d %6s", x.At.Seconds(), mb(x.RSSKB), mb(x.HeapInuseKB), mb(x.StateFileKB), x.Tracked, x.Watched, x.Pending, x.Goroutines, x.LoadAvg)
		}
		verdict := "growing"
		switch {
		case s.RSSGrowth == 0:
			verdict = "not judged (too few samples after the warm-up)"
		case s.Flat:
			verdict = "flat"
		}
		p("           after the %s warm-up, last third vs first third (highest of each): RSS ×%.2f, heap ×%.2f, state file ×%.2f, tracked ×%.2f: %s",
			s.WarmUp, s.RSSGrowth, s.HeapGrowth, s.StateGrowth, s.TrackedGrowth, verdict)
		p("           connector: %s", s.Usage)
	}
	for _, a := range r.Accounting {
		p("events     %-15s %6d watched runs settled: %6d delivered, %6d still in the outbox at the end, %6d never recorded",
			a.Phase, a.Settled, a.Delivered, a.Pending, a.Lost)
	}
	if rc := r.Receiver; rc != nil {
		p("receiver   %d events received, %d duplicate deliveries, %d bad, %d refused while down; %d connections opened to it", rc.Distinct, rc.Duplicates, rc.Bad, rc.Refused, rc.Connections)
	}
	p("connector  peak RSS (VmHWM) %s, CPU %.1f s in %.1f s", mb(r.PeakRSSKB), r.TotalCPU.Seconds(), r.Elapsed.Seconds())
	for _, w := range r.Warnings {
		p("warning    %s", w)
	}
	return b.String()
}

// stagesText lists the stage histograms of a phase.
func stagesText(p func(string, ...any), stages []Stage) {
	for i, s := range stages {
		label := ""
		if i == 0 {
			label = "stages"
		}
		p("           %-7s %-70s n %7d  mean %s  p50 %s  p99 %s", label, s.Name, s.N, ms(s.Mean), ms(s.P50), ms(s.P99))
	}
}

// sources says where t3_thread results came from, when the connector counts it.
func sources(by map[string]int64) string {
	if len(by) == 0 {
		return ""
	}
	parts := make([]string, 0, len(by))
	for _, k := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
	}
	return "; results from " + strings.Join(parts, ", ")
}
