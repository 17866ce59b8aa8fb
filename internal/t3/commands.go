package t3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// Values every command from this connector carries. T3 overwrites createdBy
// with "user" for client commands but still requires it; creationSource "mcp"
// is T3's own value for commands arriving through an MCP client.
const (
	createdBy       = "user"
	creationSource  = "mcp"
	runtimeMode     = "full-access"
	interactionMode = "default"
)

// NewID returns prefix-<uuid v4>, e.g. "cmd-2f6c…". T3 leaves the format of
// client-generated ids open; UUIDs are what its own client uses.
func NewID(prefix string) string {
	return prefix + "-" + uuid.NewString()
}

// Command is one orchestration command for orchestration.dispatchCommand: a
// generated wire type plus its commandId, which is fixed when the command is
// built so that every retry of it carries the same id (T3 keeps receipts by
// commandId and answers a repeat with the original result).
type Command interface {
	CommandID() string
	CommandType() string
	json.Marshaler
}

type command struct {
	id, typ string
	payload json.Marshaler
}

func (c *command) CommandID() string            { return c.id }
func (c *command) CommandType() string          { return c.typ }
func (c *command) MarshalJSON() ([]byte, error) { return c.payload.MarshalJSON() }

// Resend is a command as it was first built — its commandId, type and JSON as sent — so that a
// later process can send it again (t3_dispatch idempotency keys): T3 applies a commandId once and
// answers a repeat with the original result.
func Resend(commandID, commandType string, body json.RawMessage) Command {
	return &command{id: commandID, typ: commandType, payload: body}
}

// ThreadCreate creates a thread in a project without starting it.
func ThreadCreate(threadID, projectID, title string, model t3rpc.ModelSelection) Command {
	p := &t3rpc.ThreadCreateCommand{
		Type:            t3rpc.ThreadCreateCommandTypeThreadCreate,
		CommandId:       NewID("cmd"),
		ThreadId:        threadID,
		ProjectId:       projectID,
		Title:           title,
		CreatedBy:       createdBy,
		CreationSource:  creationSource,
		ModelSelection:  model,
		RuntimeMode:     runtimeMode,
		InteractionMode: interactionMode,
		Branch:          t3rpc.NilString{Null: true},
		WorktreePath:    t3rpc.NilString{Null: true},
	}
	return &command{id: p.CommandId, typ: string(p.Type), payload: p}
}

// MessageDispatch sends a user message that starts a run now (on a busy
// thread T3 queues it). messageID becomes the run's userMessageId, which is how
// the run is found afterwards. titleSeed may be empty. The thread's model
// applies; change it first with ModelSelectionSet.
func MessageDispatch(threadID, messageID, text, titleSeed string) Command {
	return MessageDispatchMode(threadID, messageID, text, titleSeed, t3rpc.DispatchMode{Type: t3rpc.DispatchModeTypeStartImmediately})
}

// MessageDispatchMode is MessageDispatch with T3's dispatchMode (fixture 21):
// start_immediately and queue_after_active queue a new run on a busy thread;
// steer_active and restart_active with targetRunId (the active run) put the
// message into that run as a new attempt.
func MessageDispatchMode(threadID, messageID, text, titleSeed string, mode t3rpc.DispatchMode) Command {
	p := &t3rpc.MessageDispatchCommand{
		Type:           t3rpc.MessageDispatchCommandTypeMessageDispatch,
		CommandId:      NewID("cmd"),
		ThreadId:       threadID,
		MessageId:      messageID,
		Text:           text,
		Attachments:    []t3rpc.Attachment{},
		CreatedBy:      createdBy,
		CreationSource: creationSource,
		DispatchMode:   mode,
	}
	if titleSeed != "" {
		p.TitleSeed = t3rpc.NewOptString(titleSeed)
	}
	return &command{id: p.CommandId, typ: string(p.Type), payload: p}
}

// RunInterrupt stops a run (the thread shell's activeRunId). reason may be empty.
func RunInterrupt(threadID, runID, reason string) Command {
	p := &t3rpc.RunInterruptCommand{
		Type:      t3rpc.RunInterruptCommandTypeRunInterrupt,
		CommandId: NewID("cmd"),
		ThreadId:  threadID,
		RunId:     runID,
	}
	if reason != "" {
		p.Reason = t3rpc.NewOptString(reason)
	}
	return &command{id: p.CommandId, typ: string(p.Type), payload: p}
}

// RespondAnswers answers a pending user_input request, keyed by question id.
// T3 does not check answers against the questions: validate before calling.
func RespondAnswers(threadID, requestID string, answers t3rpc.RuntimeRequestRespondCommandAnswers) Command {
	p := &t3rpc.RuntimeRequestRespondCommand{
		Type:      t3rpc.RuntimeRequestRespondCommandTypeRuntimeRequestRespond,
		CommandId: NewID("cmd"),
		ThreadId:  threadID,
		RequestId: requestID,
		Answers:   t3rpc.NewOptRuntimeRequestRespondCommandAnswers(answers),
	}
	return &command{id: p.CommandId, typ: string(p.Type), payload: p}
}

// RespondDecision answers a pending approval: accept, acceptForSession,
// decline or cancel (which ends the run cancelled).
func RespondDecision(threadID, requestID string, decision t3rpc.ApprovalDecision) Command {
	p := &t3rpc.RuntimeRequestRespondCommand{
		Type:      t3rpc.RuntimeRequestRespondCommandTypeRuntimeRequestRespond,
		CommandId: NewID("cmd"),
		ThreadId:  threadID,
		RequestId: requestID,
		Decision:  t3rpc.NewOptApprovalDecision(decision),
	}
	return &command{id: p.CommandId, typ: string(p.Type), payload: p}
}

// ModelSelectionSet changes a thread's model and options within its provider
// instance.
func ModelSelectionSet(threadID string, model t3rpc.ModelSelection) Command {
	p := &t3rpc.ThreadModelSelectionSetCommand{
		Type:           t3rpc.ThreadModelSelectionSetCommandTypeThreadModelSelectionSet,
		CommandId:      NewID("cmd"),
		ThreadId:       threadID,
		ModelSelection: model,
	}
	return &command{id: p.CommandId, typ: string(p.Type), payload: p}
}

// LaunchThreadInput builds the input of orchestration.launchThread: a thread
// in the project's root workspace, started with text (when not empty) as its
// first message.
func LaunchThreadInput(threadID, projectID, title string, model t3rpc.ModelSelection, messageID, text string) *t3rpc.LaunchThreadInput {
	in := &t3rpc.LaunchThreadInput{
		CommandId:         NewID("cmd"),
		CreationSource:    creationSource,
		ThreadId:          threadID,
		ProjectId:         projectID,
		Title:             title,
		ModelSelection:    model,
		RuntimeMode:       runtimeMode,
		InteractionMode:   interactionMode,
		WorkspaceStrategy: t3rpc.WorkspaceStrategy{Type: "root"},
	}
	if text != "" {
		msg := t3rpc.InitialMessage{Text: text, Attachments: []t3rpc.Attachment{}}
		if messageID != "" {
			msg.MessageId = t3rpc.NewOptString(messageID)
		}
		in.InitialMessage = t3rpc.NewOptInitialMessage(msg)
	}
	return in
}

// Connect returns a live socket to one machine, e.g. the machine watcher's
// shared one. Dispatch does not close what it returns.
type Connect func(context.Context) (*effectrpc.Conn, error)

// retry bounds the resending of a command whose reply was lost.
var retry = struct {
	attempts  int
	base, max time.Duration
}{attempts: 4, base: 250 * time.Millisecond, max: 2 * time.Second}

// retryBackOff doubles the delay from retry.base up to retry.max, each delay randomized by ±25 %
// so that several commands cut off by one lost socket do not resend in lockstep.
func retryBackOff() backoff.BackOff {
	return &backoff.ExponentialBackOff{InitialInterval: retry.base, RandomizationFactor: 0.25, Multiplier: 2, MaxInterval: retry.max}
}

// Dispatch sends cmd through orchestration.dispatchCommand and returns the
// sequence of its last event. When the reply is lost (the socket closed before
// the Exit) it resends the same command — same commandId — on a socket from
// connect, a bounded number of times with backoff: T3 applies a commandId once
// and answers a repeat with the original result. A refusal from T3 (a typed
// failure or a defect) is returned at once, never retried.
//
// The socket should stay open while the run goes on: T3 was seen to drop the
// agent's output of a run whose dispatching socket closed right away.
func Dispatch(ctx context.Context, connect Connect, cmd Command) (int64, error) {
	var res t3rpc.DispatchResult
	err := idempotent(ctx, connect, "orchestration.dispatchCommand", cmd.CommandType(), cmd.CommandID(), cmd, &res)
	if err != nil {
		return 0, err
	}
	return res.Sequence, nil
}

// Launch calls orchestration.launchThread with the same lost-reply retry as
// Dispatch (T3 journals a launch under its commandId).
func Launch(ctx context.Context, connect Connect, in *t3rpc.LaunchThreadInput) (*t3rpc.LaunchThreadResult, error) {
	var res t3rpc.LaunchThreadResult
	if err := idempotent(ctx, connect, "orchestration.launchThread", "thread launch", in.CommandId, in, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

func idempotent(ctx context.Context, connect Connect, method, what, commandID string, payload, result any) error {
	var machine string
	var lost error // the last lost-reply error, once one happened
	attempts := 0
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempts++
		conn, err := connect(ctx)
		if err != nil {
			if lost == nil || ctx.Err() != nil {
				// Nothing was sent yet, or the caller gave up: connect's own error says it.
				return struct{}{}, backoff.Permanent(err)
			}
			lost = err
			return struct{}{}, err
		}
		machine = conn.Label()
		if err := conn.Call(ctx, method, payload, result); err != nil {
			if !errors.Is(err, effectrpc.ErrClosed) || ctx.Err() != nil {
				return struct{}{}, backoff.Permanent(rpcError(machine, what, err, nil))
			}
			lost = err // resent, same commandId, after a delay
			return struct{}{}, err
		}
		return struct{}{}, nil
	}, backoff.WithBackOff(retryBackOff()), backoff.WithMaxTries(uint(retry.attempts)), backoff.WithMaxElapsedTime(0))
	var refused *backoff.PermanentError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused): // Retry returns it still wrapped when it came on the last try
		return refused.Unwrap()
	case attempts < retry.attempts:
		return err // the caller gave up while waiting to resend
	}
	return &Error{Machine: machine, Op: what, Code: CodeReplyLost, Err: lost, Message: fmt.Sprintf(
		"%s: no reply to %s command %s after %d attempts (last: %v); it may or may not have been applied, and sending the same command again is safe",
		onMachine(machine), what, commandID, attempts, lost)}
}
