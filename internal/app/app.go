// Package app assembles the connector from its parts — config, store, fleet,
// event detector, outbox, tools, HTTP server — for `serve`, `stdio` and the
// tests that run the whole thing in-process.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/lease"
	"github.com/t3code-mcp/t3code-mcp/internal/memreturn"
	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
	"github.com/t3code-mcp/t3code-mcp/internal/server"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// Settings are everything the environment configures (see docs/configuration.md).
type Settings struct {
	ConfigPath string // T3CODE_MCP_CONFIG (the command layer falls back to ./t3code.toml)
	Host       string // T3CODE_MCP_HOST (127.0.0.1)
	Port       int    // T3CODE_MCP_PORT (8000)
	StateDir   string // T3CODE_MCP_STATE_DIR
	// DatabaseURL (T3CODE_MCP_DATABASE_URL), when set, keeps the state in PostgreSQL (shared by
	// replicas) instead of the bbolt file in StateDir. It holds a password: never log it.
	DatabaseURL string

	HookURL, HookToken, HookSecret string        // T3CODE_MCP_HOOK_URL, _TOKEN, _SECRET
	HookMaxAge                     time.Duration // T3CODE_MCP_HOOK_MAX_AGE (24h)
	HookConcurrency                int           // T3CODE_MCP_HOOK_CONCURRENCY (256): threads delivered in parallel at most (the outbox adapts below it)
	HookEnrichConcurrency          int           // T3CODE_MCP_HOOK_ENRICH_CONCURRENCY (32): reads of T3 completing events in flight
	HookEnrichTimeout              time.Duration // T3CODE_MCP_HOOK_ENRICH_TIMEOUT (2m): how long an event waits for its details from T3 before it goes out marked partial

	Token  string // T3CODE_MCP_TOKEN: bearer required on /mcp
	Origin string // T3CODE_MCP_ORIGIN: origin of stdio calls

	// ReadOnly (T3CODE_MCP_READ_ONLY) offers only the read tools: the
	// mutating ones are not even listed.
	ReadOnly bool

	SessionTimeout time.Duration // T3CODE_MCP_SESSION_TIMEOUT (30m)
	MaxBodyBytes   int64         // T3CODE_MCP_MAX_BODY_BYTES (4 MiB)
	HTTPTimeout    time.Duration // T3CODE_MCP_T3_TIMEOUT (15s): each HTTP read of a T3 machine
	PongTimeout    time.Duration // T3CODE_MCP_T3_PONG_TIMEOUT (10s): a machine's socket without a Pong this long after a Ping is dropped and reconnected
	// ThreadRetention: tracked threads nobody watches are forgotten this long
	// after their last update (T3CODE_MCP_THREAD_RETENTION, 72h).
	ThreadRetention time.Duration
	// IdempotencyRetention: t3_dispatch idempotency keys are kept this long
	// (T3CODE_MCP_IDEMPOTENCY_RETENTION, 24h).
	IdempotencyRetention time.Duration
	// HookRetention: delivered events are kept this long, then deleted
	// (T3CODE_MCP_HOOK_RETENTION, 24h).
	HookRetention time.Duration
	// PruneInterval: how often delivered events and unwatched threads past
	// their retention are deleted (T3CODE_MCP_PRUNE_INTERVAL); zero: the
	// outbox every 10 minutes, the tracked threads every hour.
	PruneInterval time.Duration
	// Lookup tunes the detector's thread look-ups (tests shorten the
	// backoff); zero values pick the defaults.
	Lookup events.LookupOptions
	Limits tools.Limits
	// MaxWaitFeeds (T3CODE_MCP_MAX_WAIT_FEEDS, 2000; 0: none): how many waited
	// threads t3_wait keeps current from their own T3 subscription at once, so
	// that a result is rendered without reading the thread (internal/threadfeed);
	// waits beyond it read the thread when their run settles.
	MaxWaitFeeds int
	// ThreadFeeds (T3CODE_MCP_THREAD_FEEDS, 100; 0: none): how many threads
	// t3_thread keeps current from their own T3 subscription after a call
	// (within MaxWaitFeeds), so that the next call on the thread renders from
	// memory instead of reading it; each is let go ThreadFeedIdle
	// (T3CODE_MCP_THREAD_FEED_IDLE, 2m) after the thread's last t3_thread, the
	// least recently used first when more are wanted.
	ThreadFeeds    int
	ThreadFeedIdle time.Duration
	// HeapReserveMB (T3CODE_MCP_HEAP_RESERVE_MB, 16; 0: none): the MiB of Go heap the process
	// keeps mapped while quiet, with the collector's goal set to cycle inside them
	// (internal/memreturn, reserve.go). Applied by the command (serve, stdio): memory is the
	// process's, not one App's.
	HeapReserveMB int

	// LeaseTTL (T3CODE_MCP_LEASE_TTL, 6s): with PostgreSQL, how long a replica's lease on a
	// machine lives without renewal; a dead holder's machines move within TTL + TTL/3.
	LeaseTTL time.Duration
	// ClaimTTL (T3CODE_MCP_CLAIM_TTL, 30s): with PostgreSQL, how long a replica's claim on an
	// event it is delivering lasts unless renewed; a dead replica's events are taken over after
	// it (a stopped one's at once: it releases its claims).
	ClaimTTL time.Duration

	// Audit log (docs/guardrails.md): <StateDir>/audit.log, rotated by size.
	AuditMaxBytes int64 // T3CODE_MCP_AUDIT_MAX_BYTES (10 MiB)
	AuditKeep     int   // T3CODE_MCP_AUDIT_KEEP (3 rotated files)
	// AuditRetention (T3CODE_MCP_AUDIT_RETENTION, 0: kept): with PostgreSQL, the shared audit
	// table's records are deleted this long after they were written (audit.KeepFor, every
	// PruneInterval, by every replica: idempotent).
	AuditRetention time.Duration
}

// defaultStateDir is where state lives when T3CODE_MCP_STATE_DIR is unset.
func defaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "t3code-mcp")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "t3code-mcp")
	}
	return "t3code-mcp-state"
}

// SettingsFromEnv reads the settings; errors name the variable.
func SettingsFromEnv(getenv func(string) string) (Settings, error) {
	s := Settings{
		ConfigPath:  getenv("T3CODE_MCP_CONFIG"),
		Host:        getenv("T3CODE_MCP_HOST"),
		StateDir:    getenv("T3CODE_MCP_STATE_DIR"),
		DatabaseURL: getenv("T3CODE_MCP_DATABASE_URL"),
		HookURL:     getenv("T3CODE_MCP_HOOK_URL"),
		HookToken:   getenv("T3CODE_MCP_HOOK_TOKEN"),
		HookSecret:  getenv("T3CODE_MCP_HOOK_SECRET"),
		Token:       getenv("T3CODE_MCP_TOKEN"),
		Origin:      getenv("T3CODE_MCP_ORIGIN"),
	}
	if s.Host == "" {
		s.Host = "127.0.0.1"
	}
	if s.StateDir == "" {
		s.StateDir = defaultStateDir()
	}
	var errs []error
	intVar := func(name string, dst *int, def int) {
		*dst = def
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive whole number", name, v))
				return
			}
			*dst = n
		}
	}
	durVar := func(name string, dst *time.Duration, def time.Duration) {
		*dst = def
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive duration such as 30s or 24h", name, v))
				return
			}
			*dst = d
		}
	}
	if v := getenv("T3CODE_MCP_READ_ONLY"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("T3CODE_MCP_READ_ONLY=%q: want true or false", v))
		}
		s.ReadOnly = b
	}
	intVar("T3CODE_MCP_PORT", &s.Port, 8000)
	if s.Port > 65535 {
		errs = append(errs, fmt.Errorf("T3CODE_MCP_PORT=%d: not a port", s.Port))
	}
	durVar("T3CODE_MCP_HOOK_MAX_AGE", &s.HookMaxAge, 24*time.Hour)
	intVar("T3CODE_MCP_HOOK_CONCURRENCY", &s.HookConcurrency, outbox.DefaultConcurrency)
	intVar("T3CODE_MCP_HOOK_ENRICH_CONCURRENCY", &s.HookEnrichConcurrency, outbox.DefaultEnrichConcurrency)
	durVar("T3CODE_MCP_HOOK_ENRICH_TIMEOUT", &s.HookEnrichTimeout, outbox.DefaultEnrichTimeout)
	durVar("T3CODE_MCP_SESSION_TIMEOUT", &s.SessionTimeout, 30*time.Minute)
	durVar("T3CODE_MCP_T3_TIMEOUT", &s.HTTPTimeout, 15*time.Second)
	durVar("T3CODE_MCP_T3_PONG_TIMEOUT", &s.PongTimeout, 2*effectrpc.DefaultPingInterval)
	durVar("T3CODE_MCP_THREAD_RETENTION", &s.ThreadRetention, events.DefaultRetention)
	durVar("T3CODE_MCP_IDEMPOTENCY_RETENTION", &s.IdempotencyRetention, tools.DefaultIdempotencyRetention)
	durVar("T3CODE_MCP_HOOK_RETENTION", &s.HookRetention, outbox.DefaultRetention)
	durVar("T3CODE_MCP_PRUNE_INTERVAL", &s.PruneInterval, 0)
	durVar("T3CODE_MCP_LEASE_TTL", &s.LeaseTTL, lease.DefaultTTL)
	durVar("T3CODE_MCP_CLAIM_TTL", &s.ClaimTTL, outbox.DefaultClaimTTL)
	var body int
	intVar("T3CODE_MCP_MAX_BODY_BYTES", &body, 4<<20)
	s.MaxBodyBytes = int64(body)
	intVar("T3CODE_MCP_MAX_PROMPT_CHARS", &s.Limits.MaxPromptChars, 100_000)
	intVar("T3CODE_MCP_MAX_ANSWER_BYTES", &s.Limits.MaxAnswerBytes, 64<<10)
	intVar("T3CODE_MCP_MAX_WAITS", &s.Limits.MaxWaits, 2000)
	intVar("T3CODE_MCP_MAX_WAITS_PER_SESSION", &s.Limits.MaxWaitsPerSession, 50)
	// countVar is intVar that takes 0 (none) too.
	countVar := func(name string, dst *int, def int) {
		*dst = def
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a whole number, 0 for none", name, v))
				return
			}
			*dst = n
		}
	}
	countVar("T3CODE_MCP_MAX_WAIT_FEEDS", &s.MaxWaitFeeds, 2000)
	countVar("T3CODE_MCP_THREAD_FEEDS", &s.ThreadFeeds, 100)
	durVar("T3CODE_MCP_THREAD_FEED_IDLE", &s.ThreadFeedIdle, 2*time.Minute)
	countVar("T3CODE_MCP_HEAP_RESERVE_MB", &s.HeapReserveMB, memreturn.DefaultReserve>>20)
	durVar("T3CODE_MCP_CALL_TIMEOUT", &s.Limits.CallTimeout, 60*time.Second)
	durVar("T3CODE_MCP_MAX_WAIT", &s.Limits.MaxWait, time.Hour)
	// Audit log rotation.
	var auditMax int
	intVar("T3CODE_MCP_AUDIT_MAX_BYTES", &auditMax, audit.DefaultMaxBytes)
	s.AuditMaxBytes = int64(auditMax)
	intVar("T3CODE_MCP_AUDIT_KEEP", &s.AuditKeep, audit.DefaultKeep)
	durVar("T3CODE_MCP_AUDIT_RETENTION", &s.AuditRetention, 0)
	if err := checkDatabaseURL(s.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}

// App is one running connector.
type App struct {
	Settings Settings
	Config   *config.Config
	Store    store.Store
	Fleet    *fleet.Fleet
	Detector *events.Detector // nil without a hook URL
	Push     *tools.Push      // MCP resource subscriptions
	Outbox   *outbox.Outbox   // nil without a hook URL
	// enricher completes the outbox's events from T3; the detector starts its reads before an
	// event's commit (events.Enricher.Prefetch). Nil without a hook URL.
	enricher *events.Enricher
	Deps     *tools.Deps
	MCP      *mcp.Server
	Handler  http.Handler
	Registry *prometheus.Registry
	// Audit is <state dir>/audit.log, or with PostgreSQL the shared table (audit.Shared, that
	// file its overflow).
	Audit audit.Writer
	Log   *slog.Logger

	// replication: the machine leases when replicas share PostgreSQL; nil with bbolt.
	replication *replication
	closeOnce   sync.Once
}

// Options are what the caller hands the assembly besides the settings.
type Options struct {
	Logger  *slog.Logger
	Version string // MCP serverInfo.version and the / page; "dev" when empty
	// Config is the machines file, already read; nil reads Settings.ConfigPath,
	// which must then be set.
	Config *config.Config
	// Tokens are bearer tokens by machine name, handed to the fleet directly
	// (see fleet.Options.Tokens); a machine not listed reads its token_env.
	Tokens map[string]string
	// DemoMachines are marked as demo machines in t3_machines and /healthz.
	DemoMachines map[string]bool
}

// New builds the connector. It does not start anything: see Run.
func New(s Settings, o Options) (*App, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	a := &App{Settings: s, Log: log}
	cfg, err := configOf(s, o)
	if err != nil {
		return nil, err
	}
	a.Config = cfg
	st, err := OpenStore(s)
	if err != nil {
		return nil, err
	}
	a.Store = st
	// With PostgreSQL this process is one replica among several: one id names it in the machine
	// leases, the delivery claims, its audit records, /healthz and the logs.
	var replicaID string
	if s.DatabaseURL != "" {
		replicaID = lease.DefaultReplicaID()
		log.Info("replica of a shared PostgreSQL store", "replica", replicaID, "lease_ttl", s.LeaseTTL.String(), "claim_ttl", s.ClaimTTL.String())
	}
	a.Registry = prometheus.NewRegistry()
	a.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	wm, err := watch.NewMetrics(a.Registry)
	if err != nil {
		return nil, err
	}
	a.Fleet = fleet.New(cfg, st, fleet.Options{Logger: log, HTTPTimeout: s.HTTPTimeout, PongTimeout: s.PongTimeout, Tokens: o.Tokens, DemoMachines: o.DemoMachines, WatchMetrics: wm, MaxWaitFeeds: s.MaxWaitFeeds, ThreadFeeds: s.ThreadFeeds, ThreadFeedIdle: s.ThreadFeedIdle})
	if s.HookURL != "" {
		if err := a.newEvents(replicaID); err != nil {
			a.Close()
			return nil, err
		}
	}
	a.newDeps()
	if err := a.openAudit(replicaID); err != nil {
		a.Close()
		return nil, err
	}
	a.Deps.Audit = a.Audit
	a.MCP = server.NewMCPServer(a.Deps, o.Version)
	a.Handler = server.Handler(a.MCP, a.Fleet, server.Options{Version: o.Version,
		Token: s.Token, SessionTimeout: s.SessionTimeout, MaxBodyBytes: s.MaxBodyBytes, Logger: log, Registry: a.Registry,
		Health:       func() map[string]any { return a.health() },
		OnSessionEnd: a.Deps.EndSession,
	})
	return a, nil
}

// configOf is the configuration given (Options.Config) or loaded from s.ConfigPath.
func configOf(s Settings, o Options) (*config.Config, error) {
	if o.Config != nil {
		return o.Config, nil
	}
	if s.ConfigPath == "" {
		return nil, errors.New("no config: set T3CODE_MCP_CONFIG (or --config) to a t3code.toml (see t3code.example.toml)")
	}
	return config.Load(s.ConfigPath)
}

// newEvents builds the webhook outbox and the event detector (events are on: a hook URL is set).
func (a *App) newEvents(replicaID string) error {
	s, st, fl := a.Settings, a.Store, a.Fleet
	m, err := outbox.NewMetrics(a.Registry)
	if err != nil {
		return err
	}
	// One group committer for the store: the detector's chunks and, with bbolt, the outbox's
	// delivery records share its transactions and fsyncs.
	gm, err := store.NewGroupMetrics(a.Registry)
	if err != nil {
		return err
	}
	group := store.NewGroup(st).WithMetrics(gm)
	var queue outbox.Queue = st
	// With bbolt the group commit also hands every event it made durable to the outbox in
	// memory (Group.OnDurable), so that the outbox neither scans for it nor reads it back before
	// sending it; the outbox then needs no Notify from the detector.
	handOver := group.SharesRecords()
	if handOver {
		queue = groupRecords{st, group}
	}
	// The detector's metrics, the enricher's too (its prefetches).
	em, err := events.NewMetrics(a.Registry)
	if err != nil {
		return err
	}
	a.enricher = events.NewEnricher(fl).WithMetrics(em)
	ob, err := outbox.New(queue, outbox.Config{URL: s.HookURL, Token: s.HookToken, Secret: s.HookSecret, MaxAge: s.HookMaxAge, Concurrency: s.HookConcurrency, EnrichConcurrency: s.HookEnrichConcurrency, Logger: a.Log, Metrics: m,
		Retention: s.HookRetention, PruneEvery: s.PruneInterval,
		Enricher: a.enricher, EnrichTimeout: s.HookEnrichTimeout,
		Claimant: replicaID, ClaimTTL: s.ClaimTTL, HandOver: handOver})
	if err != nil {
		return err
	}
	a.Outbox = ob
	notify := ob.Notify
	if handOver && group.OnDurable(ob.Committed) {
		notify = nil // Committed wakes the outbox, before the detector's Commit returns
	}
	// The detector reads threads through the fleet (look-ups, off the
	// Ack path) and the fleet hands it every chunk from Start on.
	do := events.Options{
		Store: group, Tracked: st, Read: fl, Logger: a.Log, Notify: notify, Metrics: em, Retention: s.ThreadRetention, PruneEvery: s.PruneInterval, Lookup: s.Lookup,
		Prefetch: a.enricher.Prefetch,
	}
	if p, ok := any(st).(pooled); ok {
		// Replicas share the store: each machine's events are detected by its lease holder.
		a.replication = newReplication(p, fl, s, a, replicaID)
		do.Lease, do.Rows, do.ClaimRemoved = a.replication.leases.Held, a.replication.rows, a.replication.claimRemoved
	}
	a.Detector = events.New(do)
	a.Registry.MustRegister(lookupCollector{a.Detector})
	return nil
}

// newDeps builds what the tools use, with the tool-call, wait and machine metrics.
func (a *App) newDeps() {
	s, st, fl := a.Settings, a.Store, a.Fleet
	toolCalls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t3code_mcp_tool_calls_total", Help: "MCP tool calls by tool and outcome."}, []string{"tool", "outcome"})
	a.Registry.MustRegister(toolCalls)
	waitResult := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t3code_mcp_wait_result_seconds",
		Help:    "t3_wait results by stage, once the wait was over: feed (waiting for the thread's subscription to show the settle, results rendered from it), read (the result's read of the thread from T3, when no subscription could answer), render, answered (the whole result, until handed to the MCP SDK).",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}}, []string{"stage"})
	a.Registry.MustRegister(waitResult)
	threadResults := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t3code_mcp_thread_results_total",
		Help: "t3_thread results by where they came from: feed (the thread's lingering subscription, no read), read (a read of the thread from T3)."}, []string{"source"})
	a.Registry.MustRegister(threadResults)
	waitWoken := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t3code_mcp_wait_woken_seconds",
		Help:    "How long t3_wait calls blocked before a stream showed their run settle or ask, by the stream that showed it first: shell (the machine's shell stream, the watcher's row) or feed (the thread's own subscription).",
		Buckets: []float64{.01, .1, 1, 10, 60, 300, 1800}}, []string{"by"})
	a.Registry.MustRegister(waitWoken)
	a.Push = tools.NewPush()
	a.Deps = &tools.Deps{Fleet: fl, Threads: st, Keys: store.DispatchKeys{Store: st}, Push: a.Push, Logger: a.Log, Limits: s.Limits, DefaultOrigin: s.Origin, ReadOnly: s.ReadOnly,
		IdempotencyRetention: s.IdempotencyRetention,
		OnCall: func(tool string, _ time.Duration, isError bool) {
			outcome := "ok"
			if isError {
				outcome = "error"
			}
			toolCalls.WithLabelValues(tool, outcome).Inc()
		},
		OnWaitResult: func(stage tools.WaitStage, d time.Duration) {
			waitResult.WithLabelValues(string(stage)).Observe(d.Seconds())
		},
		OnThreadResult: func(src tools.ThreadSource) { threadResults.WithLabelValues(string(src)).Inc() },
		OnWaitWoken: func(by string, d time.Duration) {
			waitWoken.WithLabelValues(by).Observe(d.Seconds())
		}}
	if a.Detector != nil { // a nil *Detector in the interface would not be a nil Tracker
		a.Deps.Tracker = detectorTracker{a.Detector}
	}
	a.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "t3code_mcp_active_waits", Help: "t3_wait calls now blocking."}, func() float64 { return float64(a.Deps.ActiveWaits()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "t3code_mcp_wait_feeds", Help: "Thread subscriptions open now, for t3_wait and t3_thread (T3CODE_MCP_MAX_WAIT_FEEDS bounds them all)."}, func() float64 { return float64(fl.WaitFeeds()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "t3code_mcp_thread_feeds", Help: "Thread subscriptions kept open for t3_thread now (T3CODE_MCP_THREAD_FEEDS), some shared with waits."}, func() float64 { return float64(fl.ThreadFeeds()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "t3code_mcp_machines_online", Help: "Configured machines whose socket is up."}, func() float64 {
			n := 0
			for _, m := range fl.Machines() {
				if m.Info().Online {
					n++
				}
			}
			return float64(n)
		}),
	)
}

// openAudit opens the audit log: one line per mutating tool call, in the state directory's file
// or, with PostgreSQL, in the shared table.
func (a *App) openAudit(replicaID string) error {
	s := a.Settings
	al, err := audit.Open(s.StateDir, audit.Options{MaxBytes: s.AuditMaxBytes, Keep: s.AuditKeep})
	if err != nil {
		return fmt.Errorf("state directory %s (T3CODE_MCP_STATE_DIR): %w", s.StateDir, err)
	}
	a.Audit = al
	if t, ok := a.Store.(audit.Table); ok {
		// Replicas share PostgreSQL: every replica's records go to its table, off the call's path;
		// the file takes what the buffer cannot hold (docs/guardrails.md).
		sh := audit.NewShared(t, al, audit.SharedOptions{Replica: replicaID, Logger: a.Log})
		a.Audit = sh
		a.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t3code_mcp_audit_spilled_total",
			Help: "Audit records written to this replica's audit file because the database's buffer was full or the database did not take them before shutdown."},
			func() float64 { return float64(sh.Spilled()) }))
	}
	return nil
}

// health is /healthz's events block: the outbox, and the watched threads
// whose events wait for a look-up (per machine; retried with backoff).
func (a *App) health() map[string]any {
	h := outbox.Health(a.Store, a.Settings.HookURL != "")
	if a.replication != nil {
		// Which machines' events this replica detects (docs/deploy.md).
		h["replica"] = map[string]any{"id": a.replication.leases.Replica(), "leases": a.replication.leases.Holding()}
	}
	ev, ok := h["events"].(map[string]any)
	if !ok || a.Detector == nil {
		return h
	}
	total, failing := 0, 0
	per := map[string]any{}
	for m, l := range a.Detector.Lookups() {
		total += l.Pending
		failing += l.Failing
		per[m] = map[string]any{"pending": l.Pending, "failing": l.Failing}
	}
	ev["threads_awaiting_lookup"] = total
	ev["threads_lookup_failing"] = failing
	if total > 0 {
		ev["lookups"] = per
	}
	return h
}

// Run runs the machines and the outbox until ctx ends.
func (a *App) Run(ctx context.Context) {
	a.logMachines()
	var wg sync.WaitGroup
	wg.Add(1)
	// The watcher's changes go to the event detector first (durable), then
	// to the MCP resource subscriptions.
	var sink watch.Sink = a.Push
	wg.Add(1)
	go func() { defer wg.Done(); a.Push.Run(ctx) }()
	if a.Detector != nil {
		sink = sinks{a.Detector, a.Push}
		wg.Add(1)
		go func() { defer wg.Done(); a.Detector.Run(ctx) }()
	}
	go func() { defer wg.Done(); a.Fleet.Start(ctx, sink) }()
	if a.Outbox != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.Outbox.Run(ctx) }()
	}
	if a.enricher != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.enricher.RunPrefetch(ctx) }()
	}
	if a.replication != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.replication.run(ctx) }()
	}
	if p, ok := a.Store.(audit.Pruner); ok && a.Settings.AuditRetention > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			audit.KeepFor(ctx, p, a.Settings.AuditRetention, a.Settings.PruneInterval, a.Log)
		}()
	}
	wg.Wait()
}

// logMachines says at start, one line per machine, what state each is in: a
// machine that cannot be used at all (a token variable unset) is a warning.
func (a *App) logMachines() {
	if len(a.Fleet.Machines()) == 0 {
		a.Log.Warn("no machines configured: add a [machines.NAME] table to the config", "config", a.Config.Path)
	}
	for _, m := range a.Fleet.Machines() {
		in := m.Info()
		if in.Status == fleet.Misconfigured {
			a.Log.Warn("machine misconfigured: it stays unusable until fixed and restarted", "machine", in.Name, "url", in.URL, "status", in.Status, "problem", in.Problem)
			continue
		}
		a.Log.Info("machine configured; connecting", "machine", in.Name, "url", in.URL, "status", "connecting")
	}
}

// Close releases the store and the audit log.
func (a *App) Close() {
	a.closeOnce.Do(func() {
		if a.MCP != nil {
			// Sessions of clients that never said goodbye would outlive us.
			for ss := range a.MCP.Sessions() {
				_ = ss.Close()
			}
		}
		// The audit log first: the shared one stores its buffer through the store's pool.
		if a.Audit != nil {
			_ = a.Audit.Close()
		}
		if a.Store != nil {
			_ = a.Store.Close()
		}
	})
}

// detectorTracker is the event detector as internal/tools uses it
// (tools.Tracker): it records tracked threads with their baselines and counts
// the watched threads whose events wait for a look-up.
type detectorTracker struct{ *events.Detector }

var _ tools.Tracker = detectorTracker{}

func (t detectorTracker) PendingLookups() map[string]int {
	out := map[string]int{}
	for m, l := range t.Lookups() {
		out[m] = l.Pending
	}
	return out
}

// lookupCollector exports the detector's pending look-ups per machine:
// threads whose events wait for a read of the thread (docs/reliability.md).
type lookupCollector struct{ d *events.Detector }

var (
	lookupsPendingDesc = prometheus.NewDesc("t3code_mcp_thread_lookups_pending", "Watched threads whose events wait for a read of the thread from its machine (runs or questions the shell rows could not settle).", []string{"machine"}, nil)
	lookupsFailingDesc = prometheus.NewDesc("t3code_mcp_thread_lookups_failing", "Of the threads waiting for a look-up, those whose last read failed (retried with backoff).", []string{"machine"}, nil)
)

func (c lookupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lookupsPendingDesc
	ch <- lookupsFailingDesc
}

func (c lookupCollector) Collect(ch chan<- prometheus.Metric) {
	for m, s := range c.d.Lookups() {
		ch <- prometheus.MustNewConstMetric(lookupsPendingDesc, prometheus.GaugeValue, float64(s.Pending), m)
		ch <- prometheus.MustNewConstMetric(lookupsFailingDesc, prometheus.GaugeValue, float64(s.Failing), m)
	}
}

// sinks hands each change to every sink in order; the first error stops it
// (the watcher then retries the same change, which each sink tolerates).
type sinks []watch.Sink

func (ss sinks) Apply(ctx context.Context, c watch.Change) error {
	for _, s := range ss {
		if err := s.Apply(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// ApplyQuick implements watch.QuickSink: every sink in order, while each takes the change at once.
// One that cannot ends it (false): Apply then gives the change to all of them, and those that took
// it already take it again as a retried change.
func (ss sinks) ApplyQuick(c watch.Change) bool {
	for _, s := range ss {
		qs, ok := s.(watch.QuickSink)
		if !ok || !qs.ApplyQuick(c) {
			return false
		}
	}
	return true
}

// groupRecords is the store with its Record going through the group committer (Group.Record),
// so that deliveries are recorded in the detector's transactions instead of beside them.
type groupRecords struct {
	store.Store
	g *store.Group
}

func (q groupRecords) Record(ops []store.Op) ([]error, error) { return q.g.Record(ops) }
