package t3fake

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultStepDelay is the pause between script steps that reads well in the demo: fast enough to
// finish a run in well under a second, slow enough that a watcher sees every status.
const DefaultStepDelay = 5 * time.Millisecond

// DefaultReplayLimit is the largest afterSequence gap a subscription replays; a larger gap gets a
// fresh snapshot (T3's V1 limit and V2 shell limit).
const DefaultReplayLimit = 1000

// Scopes of the two kinds of token the fake issues.
const (
	ScopeRead    = "orchestration:read"
	ScopeOperate = "orchestration:operate"
)

// Options configure a Server. The zero value is a usable protocol-2 server with a random token.
type Options struct {
	// Label is the descriptor label (the machine's name in T3's UI). Default "t3fake".
	Label string
	// EnvironmentID is the descriptor environmentId. Default: derived from Label, so one label
	// always gives the same id and two fakes with different labels never share one.
	EnvironmentID string
	// Protocol is 2 (default) or 1. Protocol 1 only changes what a client can see before it
	// refuses the server: the descriptor (no orchestrationProtocolVersion, serverVersion 0.0.45)
	// and no protocol gate on /ws and reads. See SetProtocol.
	Protocol int
	// Token is the bearer token with orchestration:read and orchestration:operate. Default: a
	// random one (see Server.Token).
	Token string
	// ReadOnlyToken, when set, is a second token with orchestration:read only.
	ReadOnlyToken string
	// StepDelay is the pause between two steps of a scripted run; 0 runs steps as fast as
	// possible (tests, load). The demo uses DefaultStepDelay.
	StepDelay time.Duration
	// ManualSteps stops the step scheduler: runs advance only when Step is called, one step per
	// call, which makes every intermediate state observable without timing.
	ManualSteps bool
	// ReplayLimit is the largest afterSequence gap replayed; 0 means DefaultReplayLimit and a
	// negative value never replays (every resume gets a snapshot).
	ReplayLimit int
	// HistoryPage is how many turn items /history returns per page (default 50) and, when set,
	// the most /threads/{id}/bounded's window holds (default T3's 75; bounded.go).
	HistoryPage int
	// KeepRuns bounds memory under load: a thread keeps its newest KeepRuns runs, and the records
	// of older finished runs (turn items, messages, requests, checkpoints, answers) are dropped
	// from its projection. Default 100; negative keeps everything, as T3 does.
	KeepRuns int
	// ControlPlane makes the thread reads (/threads/{id}, /bounded) also carry an attempt and a
	// node per run after the runs, shaped as the recorded build's (fixture 11): T3 sends them (and
	// nine more such parts, docs/benchmarks.md) and no decoder of the connector reads them, so
	// with it a thread body is nearer T3's size (the fake's is ≈ 2.5× smaller without). Off by
	// default: the harness's figures so far are without.
	ControlPlane bool
	// TicketTTL is a WebSocket ticket's lifetime. Default 5 minutes (T3's).
	TicketTTL time.Duration
	// BatchFrames sends every server message that is ready at the same moment in one JSON array
	// frame, as T3 sometimes does; off, each frame holds one message.
	BatchFrames bool
	// Addr is the listen address. Default 127.0.0.1:0 (a free port).
	Addr string
	// Now is the clock for timestamps on the wire. Default time.Now. Pacing always uses real time.
	Now func() time.Time
	// Cwd is server.getConfig's cwd. Default /srv/workspace.
	Cwd string
}

// Stats are counters since the server started.
type Stats struct {
	HTTPRequests  map[string]int64 // by route, e.g. "GET /api/orchestration/shell", "GET /ws"
	WSConnections int64            // WebSocket upgrades accepted
	WSOpen        int64            // WebSockets open now
	TicketsIssued int64
	AcksReceived  int64
	// AckFrames counts the client's frames that carried at least one Ack: fewer than
	// AcksReceived when a client sends several Acks in one frame (a JSON array).
	AckFrames  int64
	ChunksSent int64 // all connections': a Chunk out when its socket died is never acknowledged
	// ShellStreams counts the shell subscriptions open now, and ShellUnsettled those of them
	// with a Chunk awaiting its Ack or items not sent yet: "the client has applied the whole
	// shell stream" is ShellStreams > 0 && ShellUnsettled == 0, which, unlike
	// AcksReceived >= ChunksSent, can hold again after a reconnect.
	ShellStreams     int64
	ShellUnsettled   int64
	ThreadStreams    int64 // subscribeThread streams open now
	ItemsSent        int64 // stream items inside those chunks
	Requests         int64 // RPC requests received
	CommandsAccepted int64 // dispatchCommand and launchThread calls that succeeded (replays included)
	Head             int64 // the newest sequence
}

// ItemSentFunc observes every stream item when its Chunk has been written; at is when that
// write began. kind is "shell:<item kind>" (shell:snapshot, shell:thread.updated, …) or
// "thread:<event type>" (thread:run.updated, …; thread:snapshot, thread:synchronized); sequence
// is the item's sequence (a snapshot's snapshotSequence, 0 for synchronized).
type ItemSentFunc func(kind string, sequence int64, at time.Time)

// Server is one fake T3 machine. All methods are safe for concurrent use.
type Server struct {
	opts Options
	hs   *httptest.Server
	now  func() time.Time
	// ts's cache: the Unix millisecond last formatted and its text. Guarded by mu.
	tsMilli int64
	tsText  string
	prompts map[string]promptFacts // facts' cache. Guarded by mu.
	// The prompt facts last returned, and its prompt: a driver starts its runs with one prompt
	// string, which compares equal by its pointer without hashing its 200 bytes. Guarded by mu.
	lastPrompt string
	lastFacts  promptFacts

	slab slab // bytes of shell items. Guarded by mu.
	// Row caches (rows.go): the spare one encodes idle threads' rows; freeRows are those no
	// thread holds. Guarded by mu.
	spareRows rowCache
	freeRows  []*rowCache
	// The HTTP thread reads take neither mu nor the log: they find the thread under idMu (held
	// for writing, with mu, wherever threadByID changes), lock the thread's own mu, and read the
	// head from headPub (stored with every change of head).
	idMu    sync.RWMutex
	headPub atomic.Int64
	// stepDelay, replayLimit, historyPage and ticketTTL are opts with defaults applied.
	stepDelay   time.Duration
	replayLimit int
	historyPage int
	keepRuns    int
	ticketTTL   time.Duration
	envID       string

	// Fault switches: atomics, because the hot paths read them on every request and frame.
	protocol       atomic.Int32
	unauthorized   atomic.Bool
	refuseTickets  atomic.Bool
	stopPongs      atomic.Bool
	stall          atomic.Bool
	stallThreads   atomic.Bool // StallThreadStreams
	stallShell     atomic.Bool // StallShellStreams
	failThreadSubs atomic.Bool // FailThreadSubscriptions
	httpFail       atomic.Int32
	boundedRoute   atomic.Int32           // 0: served; 404 or 503: answered as an older build does
	refuseDispatch atomic.Pointer[string] // non-nil: message.dispatch fails with this message
	hangMu         sync.Mutex
	hang           chan struct{}       // non-nil while HTTPHang(true); closed to release
	threadFaults   threadFaults        // per-thread read faults (threadfaults.go)
	refusedModes   map[string][]string // provider instance → dispatch modes refused (RefuseModes; under mu)

	onItemSent atomic.Pointer[ItemSentFunc]

	statMu        sync.Mutex
	httpRequests  map[string]int64
	wsConnections atomic.Int64
	wsOpen        atomic.Int64
	ticketsIssued atomic.Int64
	acks          atomic.Int64
	ackFrames     atomic.Int64
	ackedToWriter atomic.Int64 // Chunks an Ack let go that the reader left to the writer goroutine (writeAcked)
	chunks        atomic.Int64
	items         atomic.Int64
	requests      atomic.Int64
	accepted      atomic.Int64
	diffLines     atomic.Int32 // SetDiffLines

	// mu guards the whole model below. One lock keeps every sequence, log entry and fan-out in
	// the order T3 would give them; each critical section is short (one command or one step).
	mu          sync.Mutex
	closed      bool
	head        int64
	log         []logEntry // entries with seq > logBase, ascending
	logBase     int64
	projects    []*project
	projectByID map[string]*project
	threads     []*thread // creation order, removed ones dropped
	threadByID  map[string]*thread
	receipts    map[string]receipt
	receiptIDs  []string                       // receipts in insertion order, to forget the oldest past maxReceipts
	answers     map[string]map[string][]string // runtime request id → question id → labels
	tickets     map[string]ticket
	tokens      map[string][]string // token → scopes
	conns       map[*conn]struct{}
	shellSubs   map[*sub]struct{}
	threadSubs  map[string]map[*sub]struct{}
	readyQ      []*run // runs due for their next step, in readyAt order
	nextProject int
	nextThread  int
	nextMessage int
	fiberID     int64

	wake chan struct{} // pokes the scheduler; capacity 1
	stop chan struct{} // closed by Close
	wg   sync.WaitGroup
}

type ticket struct {
	scopes  []string
	expires time.Time
}

// New starts a fake T3 server listening on Options.Addr (default 127.0.0.1, a free port).
func New(opts Options) (*Server, error) {
	s := &Server{
		opts:         opts,
		now:          opts.Now,
		stepDelay:    opts.StepDelay,
		replayLimit:  opts.ReplayLimit,
		historyPage:  opts.HistoryPage,
		ticketTTL:    opts.TicketTTL,
		envID:        opts.EnvironmentID,
		httpRequests: map[string]int64{},
		projectByID:  map[string]*project{},
		threadByID:   map[string]*thread{},
		receipts:     map[string]receipt{},
		answers:      map[string]map[string][]string{},
		prompts:      map[string]promptFacts{},
		tickets:      map[string]ticket{},
		tokens:       map[string][]string{},
		conns:        map[*conn]struct{}{},
		shellSubs:    map[*sub]struct{}{},
		threadSubs:   map[string]map[*sub]struct{}{},
		wake:         make(chan struct{}, 1),
		stop:         make(chan struct{}),
	}
	s.slab.reusable = s.slabReusable
	if s.opts.Label == "" {
		s.opts.Label = "t3fake"
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.stepDelay < 0 {
		s.stepDelay = 0
	}
	if s.replayLimit == 0 {
		s.replayLimit = DefaultReplayLimit
	}
	if s.historyPage <= 0 {
		s.historyPage = 50
	}
	s.keepRuns = opts.KeepRuns
	if s.keepRuns == 0 {
		s.keepRuns = 100
	}
	if s.ticketTTL <= 0 {
		s.ticketTTL = 5 * time.Minute
	}
	if s.envID == "" {
		s.envID = environmentID(s.opts.Label)
	}
	if s.opts.Cwd == "" {
		s.opts.Cwd = "/srv/workspace"
	}
	switch opts.Protocol {
	case 0, 2:
		s.protocol.Store(2)
	case 1:
		s.protocol.Store(1)
	default:
		return nil, fmt.Errorf("t3fake: protocol %d: only 1 and 2 exist", opts.Protocol)
	}
	if s.opts.Token == "" {
		s.opts.Token = "t3fake-" + rand.Text()
	}
	if s.opts.ReadOnlyToken == s.opts.Token {
		return nil, errors.New("t3fake: ReadOnlyToken equals Token")
	}
	s.tokens[s.opts.Token] = []string{ScopeRead, ScopeOperate}
	if s.opts.ReadOnlyToken != "" {
		s.tokens[s.opts.ReadOnlyToken] = []string{ScopeRead}
	}

	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("t3fake: listen %s: %w", addr, err)
	}
	s.hs = httptest.NewUnstartedServer(s.routes())
	s.hs.Listener.Close() // the default listener; ours honours Addr
	s.hs.Listener = ln
	s.hs.Start()

	if !opts.ManualSteps {
		s.wg.Add(1)
		go s.scheduler()
	}
	return s, nil
}

// TB is the part of testing.TB that StartT needs; an interface so this package does not import
// testing into the connector binary.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// StartT starts a server for a test and closes it when the test ends.
func StartT(t TB, opts Options) *Server {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatalf("t3fake: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// environmentID derives a stable UUID-shaped id from the label.
func environmentID(label string) string {
	h := sha256.Sum256([]byte("t3fake:" + label))
	h[6] = h[6]&0x0f | 0x40 // version 4 and variant bits, so it parses as a UUID
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// URL is the server's base URL, http://127.0.0.1:<port>.
func (s *Server) URL() string { return s.hs.URL }

// WebSocketURL is the /ws URL without ticket or protocol parameters, ws://127.0.0.1:<port>/ws.
func (s *Server) WebSocketURL() string { return "ws" + strings.TrimPrefix(s.hs.URL, "http") + "/ws" }

// Token is the bearer token with read and operate scopes.
func (s *Server) Token() string { return s.opts.Token }

// ReadOnlyToken is the read-only token, "" when none was configured.
func (s *Server) ReadOnlyToken() string { return s.opts.ReadOnlyToken }

// Label is the descriptor label.
func (s *Server) Label() string { return s.opts.Label }

// EnvironmentID is the descriptor's environmentId.
func (s *Server) EnvironmentID() string { return s.envID }

// Close stops runs, closes every socket and the listener, and returns once every goroutine the
// server started has ended. Calling it twice is harmless.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	close(s.stop)
	s.HTTPHang(false)
	for _, c := range conns {
		c.drop()
	}
	s.hs.Close()
	s.wg.Wait()
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	st := Stats{
		WSConnections:    s.wsConnections.Load(),
		WSOpen:           s.wsOpen.Load(),
		TicketsIssued:    s.ticketsIssued.Load(),
		AcksReceived:     s.acks.Load(),
		AckFrames:        s.ackFrames.Load(),
		ChunksSent:       s.chunks.Load(),
		ItemsSent:        s.items.Load(),
		Requests:         s.requests.Load(),
		CommandsAccepted: s.accepted.Load(),
		HTTPRequests:     map[string]int64{},
	}
	st.ShellStreams, st.ShellUnsettled, st.ThreadStreams = s.openStreams()
	s.statMu.Lock()
	for k, v := range s.httpRequests {
		st.HTTPRequests[k] = v
	}
	s.statMu.Unlock()
	st.Head = s.Head()
	return st
}

// OnItemSent installs (or, with nil, removes) the hook called for every stream item sent. It runs
// on the goroutine that wrote the item's Chunk, right after the write, and is given the time the
// write began (a peer's answer can never come before it): keep it fast.
func (s *Server) OnItemSent(fn func(kind string, sequence int64, at time.Time)) {
	if fn == nil {
		s.onItemSent.Store(nil)
		return
	}
	f := ItemSentFunc(fn)
	s.onItemSent.Store(&f)
}

// ChunksSent is Stats().ChunksSent without the rest of Stats (which visits every socket).
func (s *Server) ChunksSent() int64 { return s.chunks.Load() }

// Head is the newest sequence in the event log.
func (s *Server) Head() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head
}

// ---- fault switches ----

// DropConnections closes every open WebSocket at once, without a close handshake, as a network
// failure would. Subscriptions end; new connections are accepted as usual.
func (s *Server) DropConnections() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.drop()
	}
}

// RefuseTickets makes POST /api/auth/websocket-ticket fail with 500
// EnvironmentInternalError websocket_ticket_issuance_failed while on.
func (s *Server) RefuseTickets(on bool) { s.refuseTickets.Store(on) }

// SetUnauthorized makes every authenticated route, and the /ws upgrade, answer 401
// invalid_credential while on (as after the token was revoked); /api/auth/session says
// authenticated:false. Open sockets stay open.
func (s *Server) SetUnauthorized(on bool) { s.unauthorized.Store(on) }

// StopPongs makes the server ignore Ping while on, so a client's keepalive sees a dead socket.
func (s *Server) StopPongs(on bool) { s.stopPongs.Store(on) }

// StallStreams stops every stream from sending chunks while on, as a T3 that stops answering;
// items keep queueing and flow again, batched, when it is turned off. Exits and Pongs still flow.
func (s *Server) StallStreams(on bool) {
	s.stall.Store(on)
	if !on {
		s.wakeAll()
	}
}

// HTTPFail makes the orchestration and project reads answer status (for example 500 or 503) with
// EnvironmentInternalError; 0 turns it off.
func (s *Server) HTTPFail(status int) { s.httpFail.Store(int32(status)) }

// RefuseDispatch makes every message.dispatch fail with
// OrchestrationV2DispatchCommandError carrying message (as T3 refuses a
// provider that cannot take the message); "" turns it off.
func (s *Server) RefuseDispatch(message string) {
	if message == "" {
		s.refuseDispatch.Store(nil)
		return
	}
	s.refuseDispatch.Store(&message)
}

// BoundedRoute makes /threads/{id}/bounded and /history answer as an older
// build without them does: 404 (text/plain, no T3 error body) or 503 (T3's
// headless answer for an unknown path); 0 serves them again.
func (s *Server) BoundedRoute(status int) { s.boundedRoute.Store(int32(status)) }

// HTTPHang makes the orchestration and project reads block while on; turning it off (or Close)
// releases them, and they then answer normally. A client's own timeout also ends them.
func (s *Server) HTTPHang(on bool) {
	s.hangMu.Lock()
	defer s.hangMu.Unlock()
	if on && s.hang == nil {
		s.hang = make(chan struct{})
	}
	if !on && s.hang != nil {
		close(s.hang)
		s.hang = nil
	}
}

// SetProtocol switches between protocol 2 (descriptor orchestrationProtocolVersion 2, serverVersion
// 0.1.0, /ws 426 without orchestrationProtocol=2, reads 400 without the header) and protocol 1
// (field absent, serverVersion 0.0.45, no gates). Other values are ignored.
func (s *Server) SetProtocol(v int) {
	if v == 1 || v == 2 {
		s.protocol.Store(int32(v))
	}
}

// Restart simulates a server restart: every socket is dropped and the event sequence continues
// from newHead. A newHead below the current head is a replaced database: the replay log is
// emptied, so every resuming subscriber gets a snapshot (its afterSequence is ahead of the head,
// or older than the log). A higher newHead is an ordinary restart that skipped some sequences.
// State (projects, threads, runs) survives; runs keep going.
func (s *Server) Restart(newHead int64) {
	if newHead < 0 {
		newHead = 0
	}
	s.mu.Lock()
	if newHead < s.head {
		clear(s.log)
		s.log = s.log[:0]
		s.logBase = newHead
		s.slab.stopReuse()
	}
	s.head = newHead
	s.headPub.Store(newHead)
	s.mu.Unlock()
	s.DropConnections()
}

func (s *Server) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.signal()
	}
}

func (s *Server) countHTTP(route string) {
	s.statMu.Lock()
	s.httpRequests[route]++
	s.statMu.Unlock()
}

// ---- inspection helpers for tests and the demo ----

// ThreadStatus is the thread's shell status (idle or a run status).
func (s *Server) ThreadStatus(threadID string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	th := s.threadByID[threadID]
	if th == nil {
		return "", false
	}
	return th.shell.Status, true
}

// Answers are the answers recorded by runtime-request.respond for one runtime request, by
// question id (a single-select or free-text answer is a one-element list).
func (s *Server) Answers(requestID string) (map[string][]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.answers[requestID]
	if !ok {
		return nil, false
	}
	out := make(map[string][]string, len(a))
	for k, v := range a {
		out[k] = append([]string(nil), v...)
	}
	return out, true
}

// ThreadIDs lists the threads in creation order.
func (s *Server) ThreadIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(s.threads))
	for i, th := range s.threads {
		ids[i] = th.id
	}
	return ids
}

// sortedKeys is used where map order would make output nondeterministic.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ArchiveThread archives a thread as thread.archive does (a run under way
// fails); it reports whether the thread existed and was not archived yet.
func (s *Server) ArchiveThread(threadID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if th := s.threadByID[threadID]; th != nil {
		th.mu.Lock()
		defer th.mu.Unlock()
	}
	_, fail := s.archive("t3fake-archive-"+threadID, threadID)
	return fail == nil
}
