package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
)

// DefaultIdempotencyRetention is how long a t3_dispatch idempotency key is
// kept when Deps.IdempotencyRetention is zero (T3CODE_MCP_IDEMPOTENCY_RETENTION).
const DefaultIdempotencyRetention = 24 * time.Hour

// dispatchPlan is everything one t3_dispatch call sends and records, fixed
// before anything is sent. Under an idempotency key it is the stored record:
// a retry — after a timeout, a dropped connection or a restart of the
// connector — sends the very same commands (same commandIds, which T3 applies
// once) or, once they were accepted, returns what the first call returned.
// The thread id is chosen here, so a retry can never make a second thread.
type dispatchPlan struct {
	Fingerprint  string `json:"fingerprint"` // the call's arguments; a key reused for another call is refused
	Machine      string `json:"machine"`
	ThreadID     string `json:"threadId"`
	ProjectID    string `json:"projectId"`
	ProjectTitle string `json:"projectTitle"`
	Title        string `json:"title,omitempty"`
	Origin       string `json:"origin,omitempty"`
	Watch        bool   `json:"watch"`
	MessageID    string `json:"messageId"`
	Created      bool   `json:"created"`
	// Mode is T3's dispatchMode of the prompt; Target the run steer_active /
	// restart_active put it into (the run the result names and a wait follows).
	Mode   string `json:"mode,omitempty"`
	Target string `json:"target,omitempty"`
	// PrevLatest is the thread's latest run before the prompt: the run T3
	// makes of it is the next one. Busy: a run was active (the prompt queues).
	PrevLatest string     `json:"prevLatest,omitempty"`
	Busy       bool       `json:"busy,omitempty"`
	Branch     string     `json:"branch,omitempty"`
	Steps      []planStep `json:"steps"`

	// Set once T3 accepted every step.
	Sent   bool   `json:"sent,omitempty"`
	RunID  string `json:"runId,omitempty"`
	Queued bool   `json:"queued,omitempty"`
}

// planStep is one command as built: an orchestration.dispatchCommand command,
// or (Launch) the input of orchestration.launchThread.
type planStep struct {
	Launch bool            `json:"launch,omitempty"`
	ID     string          `json:"id"`
	Type   string          `json:"type"`
	Body   json.RawMessage `json:"body"`
}

func commandStep(cmd t3.Command) (planStep, error) {
	b, err := cmd.MarshalJSON()
	return planStep{ID: cmd.CommandID(), Type: cmd.CommandType(), Body: b}, err
}

func launchStep(in *t3rpc.LaunchThreadInput) (planStep, error) {
	b, err := in.MarshalJSON()
	return planStep{Launch: true, ID: in.CommandId, Type: "orchestration.launchThread", Body: b}, err
}

// rekeyed is the step with a new commandId (for a command T3 refused).
func (s planStep) rekeyed() (planStep, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(s.Body, &fields); err != nil {
		return s, err
	}
	s.ID = t3.NewID("cmd")
	fields["commandId"], _ = json.Marshal(s.ID)
	b, err := json.Marshal(fields)
	s.Body = b
	return s, err
}

// command is the step as a t3.Command (what approval fingerprints and
// dispatchCommand sends).
func (s planStep) command() t3.Command { return t3.Resend(s.ID, s.Type, s.Body) }

func (p *dispatchPlan) commands() []t3.Command {
	out := make([]t3.Command, len(p.Steps))
	for i, s := range p.Steps {
		out[i] = s.command()
	}
	return out
}

// steers reports whether the prompt goes into the active run instead of making one.
func (p *dispatchPlan) steers() bool { return p.Target != "" }

// callFingerprint is a digest of the arguments that decide what a dispatch
// does; watch is left out (it changes no command).
func callFingerprint(in mcptools.DispatchInput) string {
	w := in.Worktree.Or(mcptools.WorktreeSpec{})
	h := sha256.New()
	for _, v := range []string{
		strings.TrimSpace(in.Machine.Or("")), strings.TrimSpace(in.Project.Or("")), strings.TrimSpace(in.ThreadID.Or("")),
		in.Prompt, strings.TrimSpace(in.Title.Or("")), strings.TrimSpace(in.Model.Or("")), string(in.Mode.Or("")),
		w.BaseRef.Or(""), w.Branch.Or(""), w.Path.Or(""),
	} {
		// Length-prefixed, so that no two argument lists write the same bytes.
		fmt.Fprintf(h, "%d:%s;", len(v), v)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// keyLocks serialises the calls of this process that carry one idempotency
// key, so a concurrent duplicate waits for the first and returns its result.
// (Across processes sharing a database the store's atomic claim decides.)
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	refs int
}

func (k *keyLocks) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// idempotency is the t3_dispatch side of the store's idempotency keys.
type idempotency struct {
	locks     keyLocks
	lastPrune atomic.Int64 // unix nanos
}

func (d *Deps) keyRetention() time.Duration {
	if d.IdempotencyRetention > 0 {
		return d.IdempotencyRetention
	}
	return DefaultIdempotencyRetention
}

// pruneKeys forgets expired keys, at most once per pruneKeysEvery.
func (d *Deps) pruneKeys(now time.Time) {
	const pruneKeysEvery = 10 * time.Minute
	last := d.idem.lastPrune.Load()
	if now.UnixNano()-last < int64(pruneKeysEvery) || !d.idem.lastPrune.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	if _, err := d.Keys.Prune(now.Add(-d.keyRetention())); err != nil {
		d.Logger.Warn("could not prune expired idempotency keys", "err", err)
	}
}

// storedPlan returns the plan stored under key, if one is and it has not expired.
func (d *Deps) storedPlan(key string) (*dispatchPlan, bool, error) {
	rec, createdAt, ok, err := d.Keys.Get(key)
	if err != nil || !ok {
		return nil, false, err
	}
	if time.Since(createdAt) > d.keyRetention() {
		return nil, false, d.Keys.Delete(key)
	}
	var p dispatchPlan
	if err := json.Unmarshal(rec, &p); err != nil {
		return nil, false, fmt.Errorf("the stored idempotency key %q is unreadable: %w", key, err)
	}
	return &p, true, nil
}

// claimPlan stores p under key unless a plan is stored already (another
// process won the race): then that one is returned, to be replayed.
func (d *Deps) claimPlan(key string, p *dispatchPlan) (*dispatchPlan, bool, error) {
	rec, err := json.Marshal(p)
	if err != nil {
		return nil, false, err
	}
	stored, claimed, err := d.Keys.Claim(key, rec, time.Now().UTC())
	if err != nil || claimed {
		return p, claimed, err
	}
	var other dispatchPlan
	if err := json.Unmarshal(stored, &other); err != nil {
		return nil, false, fmt.Errorf("the stored idempotency key %q is unreadable: %w", key, err)
	}
	return &other, false, nil
}

func (d *Deps) savePlan(key string, p *dispatchPlan) {
	if key == "" {
		return
	}
	rec, err := json.Marshal(p)
	if err == nil {
		err = d.Keys.Update(key, rec)
	}
	if err != nil {
		d.Logger.Warn("could not record the outcome of an idempotent dispatch", "thread", p.ThreadID, "err", err)
	}
}

// replay answers a call whose key has a stored plan: the first call's result
// when T3 accepted its commands, else those commands sent again.
func (d *Deps) replay(ctx context.Context, c *Call, key, fingerprint string, p *dispatchPlan) (Result, error) {
	const tool = mcptools.ToolDispatch
	c.Audit.Machine, c.Audit.Project, c.Audit.Thread = p.Machine, p.ProjectTitle, p.ThreadID
	if p.Fingerprint != fingerprint {
		return Result{}, fmt.Errorf("%s: idempotency_key %q was used by an earlier call with other arguments (thread %s on machine %q); use a new key for a new call, or repeat that call's arguments exactly",
			tool, key, p.ThreadID, p.Machine)
	}
	if !p.Sent {
		m, err := d.Fleet.Machine(p.Machine)
		if err != nil {
			return Result{}, err
		}
		if err := d.runPlan(ctx, c, m, p, key, nil); err != nil {
			return Result{}, err
		}
	} else if p.RunID == "" {
		// The run may have shown after the first call returned.
		if tr, ok, _ := d.Threads.GetThread(p.ThreadID); ok && tr.LastMessageID == p.MessageID {
			p.RunID = tr.LastRunID
		}
	}
	res := p.result()
	res.Text = fmt.Sprintf("idempotency_key %q: an earlier call already did this; %s", key, res.Text)
	out := res.Structured.(*mcptools.DispatchOutput)
	out.Replayed.SetTo(true)
	return res, nil
}

// runPlan tracks the thread and sends the plan's steps, then records the run
// T3 made of the prompt. shell is the thread's row as the caller saw it (nil:
// read it from the watcher, or none for a thread T3 does not have yet).
func (d *Deps) runPlan(ctx context.Context, c *Call, m *fleet.Machine, p *dispatchPlan, key string, shell *t3rpc.ThreadShell) error {
	const tool = mcptools.ToolDispatch
	if m.Config.ReadOnly() {
		return refuseReadOnly(tool, m, "start threads or send prompts")
	}
	if err := m.Ready(); err != nil {
		return err
	}
	tr, known, err := d.Threads.GetThread(p.ThreadID)
	if err != nil {
		return fmt.Errorf("%s: reading the state file: %w", tool, err)
	}
	now := time.Now().UTC()
	if !known {
		tr = tracked.Thread{ID: p.ThreadID, Machine: m.Name, CreatedAt: now}
	}
	if shell == nil && !p.Created {
		if row, ok := m.Watcher().Thread(p.ThreadID); ok {
			shell = &row
		}
	}
	tr.ProjectID, tr.ProjectTitle, tr.Title = p.ProjectID, p.ProjectTitle, p.Title
	// The previous message and run stay recorded until T3 accepts this
	// prompt: a refused prompt leaves nothing a wait could look for.
	tr.Origin, tr.Watch, tr.UpdatedAt = p.Origin, p.Watch, now
	// Recorded before T3 hears of it: a crash between the commands still
	// leaves a thread the connector knows and can report on.
	if err := d.track(m.Name, tr, shell); err != nil {
		return fmt.Errorf("%s: could not record the thread in the state file: %w", tool, err)
	}
	for i, st := range p.Steps {
		err := d.sendStep(ctx, m, st)
		if err == nil {
			continue
		}
		switch {
		case i == 0 && p.Created && (key == "" || definite(err)):
			// Nothing exists (T3 refused to create it) or, without a key,
			// nothing a retry could find: stop tracking it; a refusal also
			// frees the key for a fresh start.
			_ = d.Threads.DeleteThread(p.ThreadID)
			if key != "" {
				_ = d.Keys.Delete(key)
			}
		case key != "" && definite(err):
			// T3 answers a refused commandId with "previously rejected"
			// forever: the retry sends this step under a new one (the steps
			// before it were applied, and resending them changes nothing).
			if re, rerr := st.rekeyed(); rerr == nil {
				p.Steps[i] = re
				d.savePlan(key, p)
			}
		}
		// Under a key a lost reply keeps the plan as it is: the retry sends
		// the same commands, which T3 applies once.
		return stepError(m, p, st, err)
	}
	if p.steers() {
		tr.LastMessageID, tr.LastRunID, tr.UpdatedAt = p.MessageID, p.Target, time.Now().UTC()
		if err := d.track(m.Name, tr, nil); err != nil {
			d.Logger.Warn("could not record the dispatched message in the state file", "machine", m.Name, "thread", tr.ID, "err", err)
		}
		p.RunID = p.Target
	} else {
		p.RunID = d.sent(ctx, m, &tr, p.MessageID, p.PrevLatest)
		p.Queued = p.Busy
	}
	if row, ok := m.Watcher().Thread(p.ThreadID); ok && p.Branch == "" {
		p.Branch = row.Branch.Or("")
	}
	p.Sent = true
	d.savePlan(key, p)
	return nil
}

func (d *Deps) sendStep(ctx context.Context, m *fleet.Machine, st planStep) error {
	if !st.Launch {
		_, err := m.Dispatch(ctx, st.command())
		return err
	}
	var in t3rpc.LaunchThreadInput
	if err := in.UnmarshalJSON(st.Body); err != nil {
		return err
	}
	_, err := m.Launch(ctx, &in)
	return err
}

// definite reports whether T3 answered with a refusal (so nothing was
// applied), as opposed to a lost reply, a timeout or a dropped connection.
func definite(err error) bool {
	var te *t3.Error
	return errors.As(err, &te) && (te.Code == t3.CodeRejected || te.Code == t3.CodeDefect || te.Code == "insufficient_scope")
}

// stepError says which step T3 did not take and what state that leaves.
func stepError(m *fleet.Machine, p *dispatchPlan, st planStep, err error) error {
	const tool = mcptools.ToolDispatch
	switch {
	case st.Launch || st.Type == "thread.create":
		return fmt.Errorf("%s: creating the thread on machine %q failed: %w", tool, m.Name, err)
	case st.Type == "thread.model-selection.set":
		return fmt.Errorf("%s: changing the model of thread %q failed: %w", tool, p.ThreadID, err)
	case p.Created:
		return fmt.Errorf("%s: thread %q was created on machine %q but T3 did not take the prompt: %w (nothing runs; t3_wait on it returns idle; retry with thread_id %q)", tool, p.ThreadID, m.Name, err, p.ThreadID)
	case p.Mode != "" && p.Mode != string(t3rpc.DispatchModeTypeStartImmediately) && definite(err):
		return modeError(m, p, err)
	}
	return fmt.Errorf("%s: T3 did not take the prompt for thread %q on machine %q: %w (nothing was started; t3_wait still reports the thread's previous run)", tool, p.ThreadID, m.Name, err)
}

// result is the call's structured result and text.
func (p *dispatchPlan) result() Result {
	out := mcptools.DispatchOutput{
		ThreadID: p.ThreadID, Machine: p.Machine, Project: mcptools.ProjectRef{ID: p.ProjectID, Title: p.ProjectTitle},
		MessageID: p.MessageID, Created: p.Created, Watching: p.Watch,
	}
	if p.RunID != "" {
		out.RunID.SetTo(p.RunID)
	}
	if p.Queued {
		out.Queued.SetTo(true)
	}
	if p.Branch != "" {
		out.Branch.SetTo(p.Branch)
	}
	var text string
	switch {
	case p.Created:
		text = fmt.Sprintf("started thread %s on %s in %s", p.ThreadID, p.Machine, p.ProjectTitle)
		if p.Branch != "" {
			text += " on its own worktree, branch " + p.Branch
		}
		text += "; call t3_wait with this thread_id for the outcome"
	case p.steers():
		text = fmt.Sprintf("sent the prompt into run %s of thread %s on %s (%s); call t3_wait for the outcome", p.Target, p.ThreadID, p.Machine, modeName(p.Mode))
	case p.Queued:
		text = fmt.Sprintf("queued the prompt on thread %s on %s: it runs after the active run; t3_wait waits for it", p.ThreadID, p.Machine)
	default:
		text = fmt.Sprintf("sent the prompt to thread %s on %s; call t3_wait for the outcome", p.ThreadID, p.Machine)
	}
	return Result{Structured: &out, Text: text}
}
