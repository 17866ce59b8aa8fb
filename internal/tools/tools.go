// Package tools declares the MCP tools as data: each pairs its schema
// (generated from schema/mcp/tools.json into gen/mcptools) with a handler
// factory. Register adds them to an MCP server.
//
// One file per tool, named after it (machines.go, projects.go, dispatch*.go,
// thread*.go, wait*.go, answer.go, interrupt.go, watch.go, threads.go): its
// handler and the helpers only it uses. Shared glue: tools.go (Deps, the call
// wrapper, tracking), args.go (argument errors), guard.go (read-only policy,
// approvals, the thread a mutating tool acts on); resources.go serves thread
// resources and completions.
//
// Every tool error is a tool result with isError set and a message naming the
// machine, thread or field at fault and what to do; protocol errors are left to
// the SDK for protocol faults only. Nothing a caller sends can crash the server:
// one generic adapter (typed) decodes and validates every call's arguments into
// the tool's generated input type before its handler runs, and every handler
// runs under a recover (wrap).
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
)

// ErrShuttingDown is the cause a connector that is stopping gives the calls
// still running (see cmd/t3code-mcp): a wait ended by it says so.
var ErrShuttingDown = errors.New("the connector is shutting down; the run goes on in T3: call t3_wait again once the connector is back")

// originHeader carries the caller's conversation origin; it is recorded with
// every thread the call dispatches and travels back on every event.
const originHeader = "X-Conversation-Origin"

// Limits bound what callers may ask for. Zero values pick the defaults.
type Limits struct {
	MaxPromptChars     int           // default 100,000 (T3 accepts 120,000)
	MaxAnswerBytes     int           // default 64 KiB
	MaxWaitsPerSession int           // default 50
	MaxWaits           int           // default 2,000
	DefaultWait        time.Duration // default 600 s
	MaxWait            time.Duration // default 3600 s
	CallTimeout        time.Duration // every non-wait tool; default 60 s
	ProgressEvery      time.Duration // t3_wait progress notifications; default 15 s
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxPromptChars, 100_000)
	def(&l.MaxAnswerBytes, 64<<10)
	def(&l.MaxWaitsPerSession, 50)
	def(&l.MaxWaits, 2000)
	defd(&l.DefaultWait, 600*time.Second)
	defd(&l.MaxWait, 3600*time.Second)
	defd(&l.CallTimeout, 60*time.Second)
	defd(&l.ProgressEvery, 15*time.Second)
	return l
}

// Tracker owns the writes of tracked threads while events are on: the event
// detector (internal/events, wired in internal/app) records a thread together
// with its baseline, in one transaction serialised with the chunks being
// applied, so only transitions from then on are reported.
type Tracker interface {
	// Track records t on machine; shell, when not nil, is the thread's row
	// now, the baseline of a thread that starts being watched.
	Track(machine string, t tracked.Thread, shell *t3rpc.ThreadShell) error
	// PendingLookups counts, per machine, the watched threads that wait for
	// a read of the thread before their next events (machines without any
	// are left out).
	PendingLookups() map[string]int
}

// TrackedThreads is the state file's record of tracked threads as the tools
// read it; the store satisfies it (internal/app wires it). With events on,
// tracking a thread goes through the Tracker instead of PutThread.
type TrackedThreads interface {
	GetThread(id string) (tracked.Thread, bool, error)
	ListThreads() ([]tracked.Thread, error)
	PutThread(t tracked.Thread) error
	DeleteThread(id string) error
}

// IdempotencyKeys keeps t3_dispatch's idempotency keys; the store owns them
// (store.DispatchKeys, wired in internal/app).
type IdempotencyKeys interface {
	// Claim stores record under key unless the key is stored already: then
	// it returns the stored record, claimed false, and writes nothing.
	Claim(key string, record json.RawMessage, at time.Time) (stored json.RawMessage, claimed bool, err error)
	Get(key string) (record json.RawMessage, createdAt time.Time, ok bool, err error)
	// Update replaces a stored key's record, keeping its creation time.
	Update(key string, record json.RawMessage) error
	Delete(key string) error
	// Prune forgets the keys created before before.
	Prune(before time.Time) (int, error)
}

// track records a tracked thread: through the Tracker with events on;
// without events there is no baseline to keep.
func (d *Deps) track(machine string, tr tracked.Thread, shell *t3rpc.ThreadShell) error {
	if d.Tracker != nil {
		return d.Tracker.Track(machine, tr, shell)
	}
	return d.Threads.PutThread(tr)
}

// Deps is what the handlers use.
type Deps struct {
	Fleet *fleet.Fleet
	// Threads reads (and, without events, writes) the tracked threads.
	Threads TrackedThreads
	// Keys keeps t3_dispatch's idempotency keys.
	Keys IdempotencyKeys
	// Tracker records tracked threads with their baselines (Deps.track);
	// nil when events are off.
	Tracker Tracker
	Logger  *slog.Logger
	Limits  Limits
	// ReadOnly registers only the read tools: the mutating ones
	// (t3_dispatch, t3_answer, t3_interrupt) are not listed and cannot be
	// called (T3CODE_MCP_READ_ONLY).
	ReadOnly bool
	// DefaultOrigin is used when a call carries no X-Conversation-Origin
	// header (stdio: T3CODE_MCP_ORIGIN).
	DefaultOrigin string
	// OnCall, when set, observes every call (metrics).
	OnCall func(tool string, d time.Duration, isError bool)
	// OnWaitResult, when set, observes how long each stage of a t3_wait
	// result took once its wait was over (metrics; stage is one of the
	// WaitStage constants).
	OnWaitResult func(stage WaitStage, d time.Duration)
	// OnThreadResult, when set, counts each t3_thread result by where it
	// came from (ThreadSource).
	OnThreadResult func(src ThreadSource)
	// OnWaitWoken, when set, notes which stream woke a t3_wait that blocked
	// ("shell": the machine's shell stream; "feed": the thread's own
	// subscription; wait.WokenBy) after it waited d (metrics).
	OnWaitWoken func(by string, d time.Duration)
	// Audit, when set, gets one record per call of a mutating tool
	// (t3_dispatch, t3_answer, t3_interrupt).
	Audit Auditor
	// Push, when set, serves threads as MCP resources with subscriptions
	// (resources.go); it must also be the fleet's sink and be Run.
	Push *Push

	// IdempotencyRetention is how long t3_dispatch idempotency keys are
	// kept (T3CODE_MCP_IDEMPOTENCY_RETENTION; default 24 h).
	IdempotencyRetention time.Duration

	idem      idempotency
	waits     waitCounter
	answered  answeredSet
	approvals approvals
}

// Call is one tool call as a handler sees it.
type Call struct {
	Req    *mcp.CallToolRequest
	Args   json.RawMessage
	Origin string
	// Audit is the call's audit record: the handler fills in what it learns
	// (machine, project, thread, approval, …) and wrap writes it when the
	// tool is a mutating one.
	Audit *audit.Record

	base    context.Context // the request's context, without the call timeout
	cancels []context.CancelFunc
}

// Result is a handler's success: structured content plus a short text.
type Result struct {
	Structured json.Marshaler
	Text       string
}

// Handler runs one tool call.
type Handler func(ctx context.Context, c *Call) (Result, error)

// Tool is one tool: its declared spec and a handler factory.
type Tool struct {
	Spec    mcptools.ToolSpec
	Handler func(d *Deps) Handler
}

// handlers pairs every declared tool with its typed handler (see typed).
var handlers = map[string]adapter{
	mcptools.ToolMachines:  typed(machinesTool),
	mcptools.ToolProjects:  typed(projectsTool),
	mcptools.ToolDispatch:  typed(dispatchTool),
	mcptools.ToolThread:    typed(threadTool),
	mcptools.ToolWait:      typed(waitTool),
	mcptools.ToolAnswer:    argsAtMost(answerArgsLimit, typed(answerTool)),
	mcptools.ToolInterrupt: typed(interruptTool),
	mcptools.ToolWatch:     typed(watchTool),
	mcptools.ToolThreads:   typed(threadsTool),
}

// All returns the tools in declaration order.
func All() []Tool {
	out := make([]Tool, 0, len(mcptools.Tools))
	for _, s := range mcptools.Tools {
		a, ok := handlers[s.Name]
		if !ok {
			panic("tools: no handler for declared tool " + s.Name)
		}
		out = append(out, Tool{Spec: s, Handler: func(d *Deps) Handler { return a(d, s.Name) }})
	}
	return out
}

// adapter makes the Handler of the tool named tool.
type adapter func(d *Deps, tool string) Handler

// args is what the generated input types implement (through their pointer):
// a decoder that names the field at fault, and Validate where the schema has
// constraints (decodeArgs calls it when present).
type args[In any] interface {
	*In
	decoder
}

// typed is the one adapter from a tool's typed handler to a Handler: the
// call's arguments are decoded and validated into the tool's generated input
// type (decodeArgs: errors in words an agent can act on) before the handler
// runs, so no handler decodes arguments itself. Its errors, like the
// handler's, become isError results in wrap.
func typed[In any, P args[In]](h func(d *Deps) func(ctx context.Context, c *Call, in P) (Result, error)) adapter {
	return func(d *Deps, tool string) Handler {
		run := h(d)
		return func(ctx context.Context, c *Call) (Result, error) {
			in := P(new(In))
			if err := decodeArgs(tool, c.Args, in); err != nil {
				return Result{}, err
			}
			return run(ctx, c, in)
		}
	}
}

// argsLimit is a bound on a tool's arguments in bytes: what the limit is, the
// arguments named in its error, and the setting that raises it.
type argsLimit struct {
	max     func(Limits) int
	what    string
	setting string
}

// answerArgsLimit bounds t3_answer's answers (T3CODE_MCP_MAX_ANSWER_BYTES).
var answerArgsLimit = argsLimit{max: func(l Limits) int { return l.MaxAnswerBytes }, what: "the answers", setting: "T3CODE_MCP_MAX_ANSWER_BYTES"}

// argsAtMost refuses arguments over the limit before they are decoded.
func argsAtMost(l argsLimit, next adapter) adapter {
	return func(d *Deps, tool string) Handler {
		h := next(d, tool)
		return func(ctx context.Context, c *Call) (Result, error) {
			if max := l.max(d.Limits); len(c.Args) > max {
				return Result{}, fmt.Errorf("%s: %s are %d bytes, more than the limit of %d (%s)", tool, l.what, len(c.Args), max, l.setting)
			}
			return h(ctx, c)
		}
	}
}

// Register adds every tool to s.
func Register(s *mcp.Server, d *Deps) {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	d.Limits = d.Limits.withDefaults()
	for _, t := range All() {
		if d.ReadOnly && mutating[t.Spec.Name] {
			continue
		}
		s.AddTool(mcpTool(t.Spec), wrap(d, t.Spec.Name, t.Handler(d)))
	}
}

// mcpTool is what tools/list shows of a tool. Every byte is in every agent's
// context, so what MCP defaults to is left out: openWorldHint (true),
// destructiveHint of a read-only tool (meaningless), and the title, which
// goes in the annotations only (clients of every MCP version read it there).
func mcpTool(s mcptools.ToolSpec) *mcp.Tool {
	ann := &mcp.ToolAnnotations{Title: s.Title, ReadOnlyHint: s.ReadOnly, IdempotentHint: s.Idempotent}
	if !s.ReadOnly {
		destructive := s.Destructive
		ann.DestructiveHint = &destructive
	}
	return &mcp.Tool{
		Name:         s.Name,
		Description:  s.Description,
		InputSchema:  s.InputSchema,
		OutputSchema: s.OutputSchema,
		Annotations:  ann,
	}
}

// wrap turns a Handler into an SDK handler: origin, timeout, recover, error
// results, one log line per call, and one audit record per call of a
// mutating tool (written whatever the outcome, panics included).
func wrap(d *Deps, name string, h Handler) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		start := time.Now()
		c := &Call{Req: req, Origin: d.DefaultOrigin, base: ctx}
		if req.Params != nil {
			c.Args = req.Params.Arguments
		}
		if req.Extra != nil && req.Extra.Header != nil {
			if o := strings.TrimSpace(req.Extra.Header.Get(originHeader)); o != "" {
				c.Origin = o
			}
		}
		if len(c.Origin) > 1024 {
			c.Origin = c.Origin[:1024]
		}
		c.Audit = &audit.Record{Tool: name, Origin: c.Origin, Client: clientOf(req), Approval: audit.NotReached}
		if name != mcptools.ToolWait {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d.Limits.CallTimeout)
			defer cancel()
		}
		defer func() {
			for _, cancel := range c.cancels {
				cancel()
			}
		}()
		defer func() {
			if p := recover(); p != nil {
				d.Logger.Error("tool panicked", "tool", name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				res, err = errorResult(fmt.Errorf("%s failed with an internal error; the connector is still running, please report this", name)), nil
			}
			if mutating[name] && d.Audit != nil {
				d.writeAudit(c, res, start)
			}
			if d.OnCall != nil {
				d.OnCall(name, time.Since(start), res != nil && res.IsError)
			}
		}()
		r, herr := h(ctx, c)
		if ir := (*inputRequired)(nil); errors.As(herr, &ir) {
			d.logCall(c, name, "approval requested", start, nil)
			return ir.result(), nil
		}
		if herr != nil {
			if errors.Is(herr, context.DeadlineExceeded) && name != mcptools.ToolWait {
				herr = fmt.Errorf("%s timed out after %s: the machine did not answer in time (%v)", name, d.Limits.CallTimeout, herr)
			}
			d.logCall(c, name, "error", start, herr)
			return errorResult(herr), nil
		}
		d.logCall(c, name, "ok", start, nil)
		raw, merr := r.Structured.MarshalJSON()
		if merr != nil {
			return errorResult(fmt.Errorf("%s: could not encode the result: %v", name, merr)), nil
		}
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: r.Text}},
			StructuredContent: json.RawMessage(raw),
		}, nil
	}
}

// logCall writes the one log line of a call: session, tool, machine and
// thread where known (from what the handler learnt, else from the
// arguments), outcome, duration and, for an error, its message. Prompts and
// answers never appear.
func (d *Deps) logCall(c *Call, tool, outcome string, start time.Time, err error) {
	machine, thread := c.Audit.Machine, c.Audit.Thread
	if machine == "" || thread == "" {
		var args struct {
			Machine  string `json:"machine"`
			ThreadID string `json:"thread_id"`
		}
		_ = json.Unmarshal(c.Args, &args)
		if machine == "" {
			machine = args.Machine
		}
		if thread == "" {
			thread = args.ThreadID
		}
	}
	attrs := []any{"tool", tool, "outcome", outcome, "ms", time.Since(start).Milliseconds()}
	if c.Req != nil && c.Req.Session != nil && c.Req.Session.ID() != "" {
		attrs = append(attrs, "session", c.Req.Session.ID())
	}
	if machine != "" {
		attrs = append(attrs, "machine", text.Cut(machine, 128))
	}
	if thread != "" {
		attrs = append(attrs, "thread", text.Cut(thread, 128))
	}
	if err != nil {
		attrs = append(attrs, "err", err.Error())
	}
	d.Logger.Info("tool call", attrs...)
}

// writeAudit writes the call's audit record, its result taken from res.
func (d *Deps) writeAudit(c *Call, res *mcp.CallToolResult, start time.Time) {
	rec := *c.Audit
	rec.Time = time.Now()
	rec.Millis = time.Since(start).Milliseconds()
	switch {
	case res == nil:
		rec.SetError("no result")
	case res.InputRequests != nil:
		rec.Result = audit.ResultInputRequired
	case res.IsError:
		var text []string
		for _, ct := range res.Content {
			if tc, ok := ct.(*mcp.TextContent); ok {
				text = append(text, tc.Text)
			}
		}
		rec.SetError(strings.Join(text, " "))
	default:
		rec.Result = audit.ResultOK
	}
	if err := d.Audit.Write(rec); err != nil {
		// The call has happened; losing its line is reported loudly.
		d.Logger.Error("audit log write failed", "tool", rec.Tool, "machine", rec.Machine, "thread", rec.Thread, "err", err)
	}
}

func errorResult(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
}

// decoder is what the generated input types implement.
type decoder interface{ UnmarshalJSON([]byte) error }

// decodeArgs decodes and validates arguments with the generated decoder; its
// errors name the field (e.g. `decode field "machine"`), and are put in words
// an agent can act on.
func decodeArgs(tool string, raw json.RawMessage, v decoder) error {
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	err := v.UnmarshalJSON(raw)
	if err == nil {
		if val, ok := v.(interface{ Validate() error }); ok {
			err = val.Validate()
		}
	}
	if err == nil {
		return nil
	}
	// The decoder's words are byte offsets and Go type names: say instead
	// which argument is wrong, what it must be and what was sent.
	if msg := explainArgs(tool, raw); msg != "" {
		return fmt.Errorf("%s: %s (see the tool's input schema)", tool, msg)
	}
	return fmt.Errorf("%s: invalid arguments: %v (see the tool's input schema)", tool, err)
}

// requireText checks a required string argument is not blank.
func requireText(tool, field, v string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s: %s is empty", tool, field)
	}
	if strings.ContainsRune(v, 0) {
		return fmt.Errorf("%s: %s contains a NUL character", tool, field)
	}
	return nil
}

// answeredSet remembers runtime requests answered through this connector: T3
// may show them pending a moment longer, and they must not count as questions.
type answeredSet struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (a *answeredSet) add(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]time.Time{}
	}
	now := time.Now()
	a.m[id] = now
	for k, t := range a.m { // bounded: forget after an hour
		if now.Sub(t) > time.Hour {
			delete(a.m, k)
		}
	}
}

func (a *answeredSet) snapshot() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]bool, len(a.m))
	for k := range a.m {
		out[k] = true
	}
	return out
}

// readyMachine is the machine a read tool names in its machine argument,
// connected and with its threads loaded.
func (d *Deps) readyMachine(tool, name string) (*fleet.Machine, error) {
	if err := requireText(tool, "machine", name); err != nil {
		return nil, err
	}
	m, err := d.Fleet.Machine(name)
	if err != nil {
		return nil, err
	}
	if err := m.Ready(); err != nil {
		return nil, err
	}
	return m, nil
}
