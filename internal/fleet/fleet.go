// Package fleet holds every configured machine together: each machine's
// client and watcher, its status as t3_machines and /healthz report it, and the
// one place where project allowlists are enforced — a project no pattern admits
// does not exist for a caller: not in lists, not by id, not through a thread.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
	"github.com/t3code-mcp/t3code-mcp/internal/threadfeed"
	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// Status words, as t3_machines and /healthz show them.
const (
	Online        = "online"
	Offline       = "offline"
	Incompatible  = "incompatible"
	Misconfigured = "misconfigured"
	Unauthorized  = "unauthorized"
)

// Options for a Fleet.
type Options struct {
	Logger      *slog.Logger
	HTTPTimeout time.Duration
	// PongTimeout is how long a machine's socket may leave a Ping unanswered
	// before it is dropped and reconnected (effectrpc.Options.PongTimeout;
	// zero: two Ping intervals).
	PongTimeout time.Duration
	// DemoMachines are marked demo in t3_machines.
	DemoMachines map[string]bool
	// Tokens are bearer tokens the caller hands over directly, by machine
	// name; a machine listed here does not read its token_env. They live in
	// memory only: never written to a file, a log or an error.
	Tokens map[string]string
	// MinBackoff/MaxBackoff of reconnects (tests shorten them).
	MinBackoff, MaxBackoff time.Duration
	// WatchMetrics, when set, times every machine's shell-stream chunks.
	WatchMetrics *watch.Metrics
	// MaxWaitFeeds bounds the thread subscriptions t3_wait keeps open, all
	// machines together (Machine.Feed); 0: none, every wait result reads.
	MaxWaitFeeds int
	// ThreadFeeds bounds the thread subscriptions kept open after a
	// t3_thread call (Machine.ThreadFeed), within MaxWaitFeeds; each is let
	// go ThreadFeedIdle after its thread's last t3_thread. 0: none, every
	// t3_thread reads.
	ThreadFeeds    int
	ThreadFeedIdle time.Duration
}

// Fleet is every configured machine.
type Fleet struct {
	machines []*Machine
	byName   map[string]*Machine
	threads  TrackedThreads
	// transport carries every machine's HTTP reads (and its socket's upgrade);
	// Run closes its idle connections when it returns.
	transport *http.Transport
	log       *slog.Logger
	sink      watch.Sink // given by Start; every watcher's chunks go to it
	feeds     *threadfeed.Pool
}

// fleetSink hands each watcher's changes to the sink the fleet was started
// with: the detector reads threads through the fleet, so it exists only once
// the fleet does.
type fleetSink struct{ f *Fleet }

func (s fleetSink) Apply(ctx context.Context, c watch.Change) error {
	if s.f.sink == nil {
		return nil
	}
	return s.f.sink.Apply(ctx, c)
}

// ApplyQuick implements watch.QuickSink for the fleet's sink when it is one.
func (s fleetSink) ApplyQuick(c watch.Change) bool {
	if s.f.sink == nil {
		return true
	}
	qs, ok := s.f.sink.(watch.QuickSink)
	return ok && qs.ApplyQuick(c)
}

// Machine is one configured T3 machine.
type Machine struct {
	Name   string
	Config config.Machine
	Demo   bool

	client  *t3.Client
	watcher *watch.Watcher
	log     *slog.Logger
	feeds   *threadfeed.Pool // the fleet's

	mu        sync.RWMutex
	desc      *t3.Descriptor
	problem   error  // why the machine cannot be used, when it cannot
	status    string // a status word while not online through the watcher
	providers *t3rpc.ServerConfig

	expectMu    sync.Mutex
	expect      map[string]rowExpectation // thread id → the row a wait's subscription showed (rowcatchup.go)
	rowCatchUps atomic.Int64
}

// TrackedThreads is where the fleet looks a thread up first: the state file's
// tracked threads (the store satisfies it) name the machine a thread is on.
type TrackedThreads interface {
	GetThread(id string) (tracked.Thread, bool, error)
}

// New builds the fleet; machines whose token variable is unset are kept and
// reported as misconfigured.
func New(cfg *config.Config, threads TrackedThreads, o Options) *Fleet {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	f := &Fleet{byName: map[string]*Machine{}, threads: threads, log: o.Logger, transport: readTransport(len(cfg.Machines)), feeds: threadfeed.NewPool(o.MaxWaitFeeds)}
	f.feeds.SetLinger(o.ThreadFeeds, o.ThreadFeedIdle)
	hc := &http.Client{Transport: f.transport}
	ws := fleetSink{f}
	for _, mc := range cfg.Machines {
		m := &Machine{Name: mc.Name, Config: mc, Demo: o.DemoMachines[mc.Name], log: o.Logger.With("machine", mc.Name), status: Offline, feeds: f.feeds}
		token, err := tokenOf(mc, o.Tokens)
		if err != nil {
			m.status, m.problem = Misconfigured, misconfigured(mc.Name, err)
		} else if c, err := t3.NewClient(mc.Name, mc.URL, token, t3.Options{HTTPClient: hc, Timeout: o.HTTPTimeout, Logger: o.Logger, RPC: effectrpc.Options{PongTimeout: o.PongTimeout}, Compression: mc.Compression}); err != nil {
			m.status, m.problem = Misconfigured, misconfigured(mc.Name, err)
		} else {
			m.client = c
			m.watcher = watch.New(mc.Name, m.connect, watch.Options{Logger: o.Logger, Sink: ws, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Metrics: o.WatchMetrics})
		}
		f.machines = append(f.machines, m)
		f.byName[mc.Name] = m
	}
	return f
}

// idleReadsPerMachine is how many kept-alive HTTP connections each machine's reads keep open.
// http.DefaultTransport, which the clients used before, keeps 2 per host and 100 in all: with
// 100 machines, a machine's connection was often closed to make room for another's, and the next
// read (a t3_wait result's, an event's enrichment) dialled again; in an in-process profile of
// the latency phase (100 machines, 1,000 runs/s) a fifth of a wait result's read was spent
// getting a connection. A t3_wait result and a few enrichments of the same machine can be in
// flight at once.
const idleReadsPerMachine = 4

// readTransport is the fleet's HTTP transport: http.DefaultTransport's settings with room for
// idleReadsPerMachine idle connections to every machine.
func readTransport(machines int) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idleReadsPerMachine
	tr.MaxIdleConns = max(tr.MaxIdleConns, idleReadsPerMachine*machines)
	return tr
}

// misconfigured says why a machine cannot be used, naming it once: the cause
// may already start with `machine "x": `.
func misconfigured(name string, err error) error {
	msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("machine %q: ", name))
	return fmt.Errorf("machine %q is misconfigured: %s", name, msg)
}

// tokenOf is the machine's token: the one handed over, else its token_env.
func tokenOf(mc config.Machine, tokens map[string]string) (string, error) {
	if t, ok := tokens[mc.Name]; ok && t != "" {
		return t, nil
	}
	return mc.Token()
}

// Start gives the fleet the sink of every machine's applied changes (the
// event detector; nil when events are off) and runs every machine's watcher
// until ctx ends.
func (f *Fleet) Start(ctx context.Context, sink watch.Sink) {
	f.sink = sink
	f.Run(ctx)
}

// Run runs every machine's watcher until ctx ends, without a sink unless Start
// gave one.
func (f *Fleet) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, m := range f.machines {
		if m.watcher == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.watcher.Run(ctx)
		}()
	}
	wg.Wait()
	f.feeds.Close() // the t3_thread feeds; the waits' close with their waits
	f.transport.CloseIdleConnections()
}

// WaitFeeds counts the thread subscriptions open now, for waits and for
// t3_thread (ThreadFeeds).
func (f *Fleet) WaitFeeds() int { return f.feeds.Open() }

// Feed returns the subscription that keeps a waited thread's projection
// current (internal/threadfeed), shared with every other wait on the thread,
// and the caller's release; ok is false when the fleet's cap is reached or
// the machine cannot be used (the wait's result then reads the thread).
func (m *Machine) Feed(threadID string) (feed *threadfeed.Feed, release func(), ok bool) {
	if m.watcher == nil {
		return nil, nil, false
	}
	return m.feeds.Acquire(m.Name, threadID, m.watcher.Conn)
}

// ThreadFeeds counts the thread subscriptions kept open for t3_thread now.
func (f *Fleet) ThreadFeeds() int { return f.feeds.Lingering() }

// ThreadFeed returns the subscription that keeps a thread's projection
// current for t3_thread (internal/threadfeed), kept open for a while after
// this call so that the next t3_thread on the thread renders from memory.
// When none is open it starts one from seed, the caller's read of the
// thread (nil: none is started). ok is false when there is none, none may be
// kept, or the machine cannot be used (the call then reads the thread). The
// feed answers only once it is live and not behind the row (Feed.Current).
func (m *Machine) ThreadFeed(threadID string, seed *threadfeed.State) (feed *threadfeed.Feed, ok bool) {
	if m.watcher == nil {
		return nil, false
	}
	return m.feeds.Linger(m.Name, threadID, m.watcher.Conn, seed)
}

// connect is the watcher's way in: handshake first (a protocol-1 machine is
// refused before any socket), then a fresh ticket and the socket.
func (m *Machine) connect(ctx context.Context) (*effectrpc.Conn, error) {
	d, err := m.client.Handshake(ctx)
	if err != nil {
		m.setProblem(err)
		return nil, err
	}
	m.mu.Lock()
	m.desc = d
	m.mu.Unlock()
	conn, err := m.client.DialRPC(ctx)
	if err != nil {
		m.setProblem(err)
		return nil, err
	}
	m.mu.Lock()
	m.problem, m.status = nil, Online
	m.providers = nil // re-read after a reconnect: the machine may have changed
	m.mu.Unlock()
	return conn, nil
}

func (m *Machine) setProblem(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.problem = err
	var inc *t3.IncompatibleError
	var te *t3.Error
	switch {
	case errors.As(err, &inc):
		m.status = Incompatible
	case errors.As(err, &te) && (te.Status == 401 || te.Status == 403):
		m.status = Unauthorized
	default:
		m.status = Offline
	}
}

// Machines lists the machines in name order.
func (f *Fleet) Machines() []*Machine { return f.machines }

// Machine finds a machine by name; the error lists the configured names.
func (f *Fleet) Machine(name string) (*Machine, error) {
	if m, ok := f.byName[name]; ok {
		return m, nil
	}
	names := make([]string, 0, len(f.machines))
	for _, m := range f.machines {
		names = append(names, m.Name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("unknown machine %s: no machines are configured (add one to t3code.toml)", text.Quoted(name))
	}
	return nil, fmt.Errorf("unknown machine %s; configured machines: %s (see t3_machines)", text.Quoted(name), strings.Join(names, ", "))
}

// Info is a machine's status for t3_machines and /healthz.
type Info struct {
	Name, URL, Status, Problem string
	Online                     bool
	Protocol                   int
	ServerVersion, Label       string
	Projects                   []string
	Demo                       bool
}

// Info reports the machine's status.
func (m *Machine) Info() Info {
	m.mu.RLock()
	defer m.mu.RUnlock()
	in := Info{Name: m.Name, URL: m.Config.URL, Projects: m.Config.Projects, Demo: m.Demo, Status: m.status}
	if m.desc != nil {
		in.Protocol, in.ServerVersion, in.Label = m.desc.Protocol, m.desc.ServerVersion, m.desc.Label
	}
	if m.watcher != nil {
		ws := m.watcher.Status()
		// Online once the first snapshot is in: before that, tools would see
		// a machine with no projects and no threads.
		in.Online = ws.Online && ws.Synced
		switch {
		case in.Online:
			in.Status = Online
		case ws.Online:
			// Socket up, first snapshot not applied yet.
			in.Status = Offline
			in.Problem = fmt.Sprintf("machine %q at %s is connecting: its threads are loading", m.Name, m.Config.URL)
		case in.Status == Online:
			in.Status = Offline
		}
		if !ws.Online && m.problem == nil && ws.LastError != nil {
			in.Problem = fmt.Sprintf("machine %q at %s is offline: %v", m.Name, m.Config.URL, ws.LastError)
		}
	}
	if m.problem != nil && !in.Online {
		in.Problem = m.problem.Error()
	}
	if in.Status == Offline && in.Problem == "" {
		in.Problem = fmt.Sprintf("machine %q at %s is not connected yet", m.Name, m.Config.URL)
	}
	return in
}

// Ready returns nil when tools may act on the machine, else an error that
// says what is wrong and what to do.
func (m *Machine) Ready() error {
	in := m.Info()
	if in.Online {
		return nil
	}
	return errors.New(in.Problem)
}

// Client is the machine's HTTP client (nil when misconfigured).
func (m *Machine) Client() *t3.Client { return m.client }

// Watcher is the machine's watcher (nil when misconfigured).
func (m *Machine) Watcher() *watch.Watcher { return m.watcher }

// Allowed reports whether the allowlist admits a project.
func (m *Machine) Allowed(p t3rpc.Project) bool { return m.Config.Allows(p.Title, p.WorkspaceRoot) }

// Projects lists the allowlisted projects.
func (m *Machine) Projects() []t3rpc.Project {
	if m.watcher == nil {
		return nil
	}
	var out []t3rpc.Project
	for _, p := range m.watcher.Projects() {
		if m.Allowed(p) {
			out = append(out, p)
		}
	}
	return out
}

// Project finds an allowlisted project by id, title or workspace path. An
// ambiguous title is refused with the candidates.
func (m *Machine) Project(ref string) (t3rpc.Project, error) {
	ref = strings.TrimSpace(ref)
	projects := m.Projects()
	var byTitle []t3rpc.Project
	for _, p := range projects {
		if p.ID == ref || p.WorkspaceRoot == ref || strings.TrimRight(p.WorkspaceRoot, "/") == strings.TrimRight(ref, "/") {
			return p, nil
		}
		if p.Title == ref {
			byTitle = append(byTitle, p)
		}
	}
	switch len(byTitle) {
	case 1:
		return byTitle[0], nil
	case 0:
		names := make([]string, 0, len(projects))
		for _, p := range projects {
			names = append(names, fmt.Sprintf("%q", p.Title))
		}
		if len(names) == 0 {
			return t3rpc.Project{}, fmt.Errorf("project %s not found on machine %q: no project there is allowed (check the machine's projects patterns in t3code.toml)", text.Quoted(ref), m.Name)
		}
		return t3rpc.Project{}, fmt.Errorf("project %s not found on machine %q; available: %s (see t3_projects)", text.Quoted(ref), m.Name, strings.Join(names, ", "))
	}
	cands := make([]string, 0, len(byTitle))
	for _, p := range byTitle {
		cands = append(cands, fmt.Sprintf("%s (id %s)", p.WorkspaceRoot, p.ID))
	}
	return t3rpc.Project{}, fmt.Errorf("project title %q is ambiguous on machine %q: %s; pass the id or the path instead", ref, m.Name, strings.Join(cands, "; "))
}

// ThreadCounts counts every project's active threads in one pass.
func (m *Machine) ThreadCounts() map[string]int {
	out := map[string]int{}
	if m.watcher == nil {
		return out
	}
	for _, t := range m.watcher.Threads() {
		out[t.ProjectId]++
	}
	return out
}

func (m *Machine) ProjectByID(id string) (t3rpc.Project, bool) {
	for _, p := range m.watcher.Projects() {
		if p.ID == id {
			return p, true
		}
	}
	return t3rpc.Project{}, false
}

// errThreadNotFound is wrapped by Thread's not-found errors.
var errThreadNotFound = errors.New("thread not found")

// errThreadArchived is wrapped by Thread's error for a thread archived (or
// deleted) in T3: its machine's watcher saw it leave the list.
var errThreadArchived = errors.New("thread archived")

// Found is a thread located on a machine, in an allowlisted project.
type Found struct {
	Machine *Machine
	Shell   t3rpc.ThreadShell
	// Seq is the sequence of the item that brought Shell (watch.ThreadAt):
	// a thread feed that has reached it is not behind the row.
	Seq     int64
	Project t3rpc.Project
	Tracked tracked.Thread
	// IsTracked is true when the state file knows the thread.
	IsTracked bool
	// Gone is "archive" or "removed" for a thread that left its machine's
	// list (ThreadOrGone only); Shell then holds its id, project and title.
	Gone string
}

// Thread looks a thread up: the state file first (it names the machine), then
// every online machine's shell. A thread of a project no allowlist admits is
// reported exactly like a thread that does not exist.
func (f *Fleet) Thread(id string) (Found, error) {
	return f.thread(id, false)
}

// ThreadOrGone is Thread that also finds a thread archived or deleted in T3
// (Found.Gone set), when its project is allowlisted: t3_wait answers archived
// for it at once instead of "not found".
func (f *Fleet) ThreadOrGone(id string) (Found, error) {
	return f.thread(id, true)
}

func (f *Fleet) thread(id string, orGone bool) (Found, error) {
	id = strings.TrimSpace(id)
	if id == "" {
		return Found{}, errors.New("thread_id is empty: pass a thread id from t3_dispatch or t3_watch")
	}
	notFound := fmt.Errorf("thread %s not found on any machine (%w): check the id, or list tracked threads with t3_watch", text.Quoted(id), errThreadNotFound)
	tr, known, err := f.threads.GetThread(id)
	if err != nil {
		return Found{}, err
	}
	candidates := f.machines
	if known {
		if m, ok := f.byName[tr.Machine]; ok {
			candidates = []*Machine{m}
		}
	}
	var unchecked []string // machines that could not be searched, with their state
	for _, m := range candidates {
		if m.watcher == nil {
			unchecked = append(unchecked, fmt.Sprintf("%s (%s)", m.Name, Misconfigured))
			continue
		}
		shell, seq, ok := m.watcher.ThreadAt(id)
		if !ok && known {
			// Dispatched a moment ago: T3 has the thread, but its row may not
			// have reached the watcher yet.
			if _, ok = m.awaitRow(id, trackedRowGrace); ok {
				shell, seq, ok = m.watcher.ThreadAt(id)
			}
		}
		if !ok {
			if !m.watcher.Status().Synced {
				unchecked = append(unchecked, fmt.Sprintf("%s (%s)", m.Name, m.Info().Status))
			}
			continue
		}
		p, ok := m.ProjectByID(shell.ProjectId)
		if !ok || !m.Allowed(p) {
			return Found{}, notFound
		}
		shell, seq = m.catchUp(id, shell, seq)
		return Found{Machine: m, Shell: shell, Seq: seq, Project: p, Tracked: tr, IsTracked: known}, nil
	}
	for _, m := range candidates {
		if m.watcher == nil {
			continue
		}
		g, gone := m.watcher.GoneThread(id)
		if !gone {
			continue
		}
		p, ok := m.ProjectByID(g.ProjectID)
		if !ok || !m.Allowed(p) {
			return Found{}, notFound
		}
		if !orGone {
			what := "archived"
			if g.Where == "removed" {
				what = "deleted"
			}
			return Found{}, fmt.Errorf("thread %s was %s in T3 on machine %q (%w): unarchive it in T3 to use it, or dispatch a new thread", text.Quoted(id), what, m.Name, errThreadArchived)
		}
		shell := t3rpc.ThreadShell{ID: id, ProjectId: g.ProjectID, Title: g.Title}
		return Found{Machine: m, Shell: shell, Project: p, Tracked: tr, IsTracked: known, Gone: g.Where}, nil
	}
	if len(unchecked) > 0 {
		if m, ok := f.byName[tr.Machine]; known && ok {
			// The problem names the machine and says what to do.
			return Found{}, fmt.Errorf("thread %q cannot be read now: %v", id, m.Ready())
		}
		sort.Strings(unchecked)
		return Found{}, fmt.Errorf("thread %s not found on the reachable machines; not searched: %s (see t3_machines)", text.Quoted(id), strings.Join(unchecked, ", "))
	}
	return Found{}, notFound
}

// trackedRowGrace is how long a lookup waits for the row of a thread the state
// file knows but the watcher has not seen yet.
const trackedRowGrace = 3 * time.Second

// awaitRow waits up to d for a thread's row to appear, woken by the watcher.
func (m *Machine) awaitRow(id string, d time.Duration) (t3rpc.ThreadShell, bool) {
	if !m.watcher.Status().Online {
		return t3rpc.ThreadShell{}, false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		shell, ok, changed := m.watcher.ThreadAndWait(id)
		if ok {
			return shell, true
		}
		select {
		case <-changed:
		case <-timer.C:
			return t3rpc.ThreadShell{}, false
		}
	}
}

// ReadThread reads a thread of a machine (the event detector's Reader).
func (f *Fleet) ReadThread(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, error) {
	m, err := f.Machine(machine)
	if err != nil {
		return nil, err
	}
	return m.Projection(ctx, threadID)
}

// ReadRecent reads the newest part of a thread (the bounded read, or the
// whole thread on a machine without it); complete says nothing was left out.
// The event detector's enrichment reads through it.
func (f *Fleet) ReadRecent(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, bool, error) {
	m, err := f.Machine(machine)
	if err != nil {
		return nil, false, err
	}
	r, err := m.Recent(ctx, threadID)
	if err != nil {
		return nil, false, err
	}
	return r.Projection, !r.Bounded || !r.HasMoreHistory, nil
}

// Projection reads a thread's full projection over HTTP.
func (m *Machine) Projection(ctx context.Context, threadID string) (*t3api.ThreadProjection, error) {
	if m.client == nil {
		return nil, m.Ready()
	}
	s, err := m.client.Thread(ctx, threadID)
	if err != nil {
		return nil, err
	}
	return &s.Projection, nil
}

// RecentKeep is Recent decoding only what keep names (t3.Keep): the newest
// runs and the ones asked for, not every run of the thread's history.
func (m *Machine) RecentKeep(ctx context.Context, threadID string, keep t3.Keep) (t3.Recent, error) {
	if m.client == nil {
		return t3.Recent{}, m.Ready()
	}
	return m.client.ThreadRecentKeep(ctx, threadID, keep)
}

// ReadRecentKeep is ReadRecent decoding only the given runs and requests and
// the newest run (the event enricher's read: t3.Keep).
func (f *Fleet) ReadRecentKeep(ctx context.Context, machine, threadID string, runIDs, requestIDs []string) (*t3api.ThreadProjection, bool, error) {
	m, err := f.Machine(machine)
	if err != nil {
		return nil, false, err
	}
	r, err := m.RecentKeep(ctx, threadID, t3.Keep{Runs: 1, RunIDs: runIDs, RequestIDs: requestIDs})
	if err != nil {
		return nil, false, err
	}
	return r.Projection, !r.Bounded || !r.HasMoreHistory, nil
}

// Recent reads a thread for showing its recent runs: the bounded read (size
// independent of the thread's history), or the whole thread on a machine
// without that route (t3.Client.ThreadRecent).
func (m *Machine) Recent(ctx context.Context, threadID string) (t3.Recent, error) {
	if m.client == nil {
		return t3.Recent{}, m.Ready()
	}
	return m.client.ThreadRecent(ctx, threadID)
}

// Dispatch sends a command on the machine's socket, retrying a lost reply
// with the same commandId.
func (m *Machine) Dispatch(ctx context.Context, cmd t3.Command) (int64, error) {
	if err := m.Ready(); err != nil {
		return 0, err
	}
	return t3.Dispatch(ctx, m.watcher.Conn, cmd)
}

// Launch creates and starts a thread in one call (orchestration.launchThread),
// the one way to put a thread on its own git worktree (fixture 20).
func (m *Machine) Launch(ctx context.Context, in *t3rpc.LaunchThreadInput) (*t3rpc.LaunchThreadResult, error) {
	if err := m.Ready(); err != nil {
		return nil, err
	}
	return t3.Launch(ctx, m.watcher.Conn, in)
}

// Providers returns the machine's provider instances and models
// (server.getConfig), cached per connection.
func (m *Machine) Providers(ctx context.Context) (*t3rpc.ServerConfig, error) {
	m.mu.RLock()
	p := m.providers
	m.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	if err := m.Ready(); err != nil {
		return nil, err
	}
	conn, err := m.watcher.Conn(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := m.client.GetConfig(ctx, conn)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.providers = cfg
	m.mu.Unlock()
	return cfg, nil
}
