package t3

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// IssueCommand is how an operator mints the token this connector needs, on the
// T3 machine itself. Error messages quote it so the fix is one copy away.
const IssueCommand = "t3 auth session issue --scope orchestration:read --scope orchestration:operate --token-only --ttl 365d --label t3code-mcp"

// Codes set by this package on Error (T3's own codes, such as auth_invalid or
// insufficient_scope, are passed through).
const (
	CodeUnreachable    = "unreachable"
	CodeTimeout        = "timeout"
	CodeCanceled       = "canceled"
	CodeNoToken        = "no_token"
	CodeBadResponse    = "bad_response"
	CodeRejected       = "command_rejected"
	CodeDefect         = "defect"
	CodeInterrupted    = "interrupted"
	CodeProtocol       = "protocol"
	CodeConnectionLost = "connection_lost"
	CodeReplyLost      = "reply_lost"
)

// Error is a failure talking to one T3 machine. Its message says what happened
// and, where there is one, what to do about it. It never contains the token.
type Error struct {
	Machine string
	// Op names what was being done: "handshake", "shell", "thread",
	// "websocket", "message.dispatch", …
	Op string
	// Status is the HTTP status T3 answered with; 403 also marks a missing scope
	// reported over RPC, 401 a WebSocket upgrade refused for its credential.
	Status int
	// Tag is T3's error class (_tag), e.g. EnvironmentScopeRequiredError.
	Tag string
	// Code is T3's code (auth_invalid, insufficient_scope, not_found, …) or one
	// of the Code* constants of this package.
	Code          string
	Reason        string
	RequiredScope string
	TraceID       string
	// Message is the full text of Error().
	Message string
	// Err is the underlying cause, for errors.Is/As (context errors,
	// effectrpc.ErrClosed, *effectrpc.Error, …).
	Err error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// IncompatibleError is a machine that does not speak orchestration protocol 2.
type IncompatibleError struct {
	Machine       string
	ServerVersion string
	Protocol      int
}

func (e *IncompatibleError) Error() string {
	if e.Protocol > 2 {
		return fmt.Sprintf("machine %q runs T3 Code %s (orchestration protocol %d); this t3code-mcp speaks protocol 2 only: update t3code-mcp",
			e.Machine, e.ServerVersion, e.Protocol)
	}
	return fmt.Sprintf("machine %q runs T3 Code %s (orchestration protocol %d); t3code-mcp needs T3 Code 0.1.0 or later (protocol 2)",
		e.Machine, e.ServerVersion, e.Protocol)
}

// errs builds the errors of one client: it knows the machine's name, where it
// is, and which secret must never be printed.
type errs struct {
	machine string
	where   string // base URL without credentials or query
	timeout time.Duration
	secrets []string
}

// finish scrubs secrets from the message and returns e.
func (x *errs) finish(e *Error) *Error {
	e.Machine = x.machine
	e.Message = x.scrub(e.Message)
	return e
}

func (x *errs) scrub(s string) string {
	for _, sec := range x.secrets {
		// A very short "token" cannot be scrubbed without mangling the text; it
		// is not a real credential either (T3 tokens are long signed strings).
		if len(sec) >= 8 {
			s = strings.ReplaceAll(s, sec, "REDACTED")
		}
	}
	return s
}

// forMachine is ` for machine "x"` or nothing when the machine is unknown.
func forMachine(m string) string {
	if m == "" {
		return ""
	}
	return fmt.Sprintf(" for machine %q", m)
}

func onMachine(m string) string {
	if m == "" {
		return "the machine"
	}
	return fmt.Sprintf("machine %q", m)
}

// tokenInvalid is the 401 message.
func tokenInvalid(machine, reason string) string {
	if reason == "missing_credential" {
		return fmt.Sprintf("no token reached %s (T3: missing_credential); issue one on that machine with `%s` and put it in the variable named by token_env",
			onMachine(machine), IssueCommand)
	}
	if reason == "" {
		reason = "auth_invalid"
	}
	return fmt.Sprintf("token%s is invalid or expired (T3: %s); reissue on that machine with `%s` and put it in the variable named by token_env",
		forMachine(machine), reason, IssueCommand)
}

// scopeMissing is the 403 / EnvironmentAuthorizationError message.
func scopeMissing(machine, scope, op string) string {
	if scope == "" {
		scope = "orchestration:operate"
	}
	return fmt.Sprintf("token%s lacks scope %q (needed for %s); reissue on that machine with `%s` and put it in the variable named by token_env",
		forMachine(machine), scope, op, IssueCommand)
}

// status maps a non-200 answer with T3's error body to an *Error.
func (x *errs) status(op string, code int, body t3api.ErrorBody, threadID, snippetText string) *Error {
	e := &Error{
		Op: op, Status: code,
		Tag: body.Tag.Or(""), Code: body.Code.Or(""), Reason: body.Reason.Or(""),
		RequiredScope: body.RequiredScope.Or(""), TraceID: body.TraceId.Or(""),
	}
	said := body.Message.Or("")
	if said == "" {
		said = e.Reason
	}
	if said == "" && snippetText != "" {
		said = snippetText
	}
	switch {
	case code == http.StatusUnauthorized:
		e.Message = tokenInvalid(x.machine, e.Reason)
	case code == http.StatusForbidden && (e.Code == "insufficient_scope" || e.RequiredScope != ""):
		e.Message = scopeMissing(x.machine, e.RequiredScope, op)
	case code == http.StatusNotFound && e.Reason == "thread_not_found":
		e.Message = fmt.Sprintf("thread %q not found on machine %q", threadID, x.machine)
	case code == http.StatusInternalServerError:
		e.Message = fmt.Sprintf("T3 on machine %q had an internal error during %s (reason: %s)%s",
			x.machine, op, orUnknown(e.Reason), traceHint(e.TraceID))
	case code == http.StatusBadRequest:
		e.Message = fmt.Sprintf("machine %q rejected the %s request as invalid (T3: %s)", x.machine, op, orUnknown(said))
	default:
		e.Message = fmt.Sprintf("machine %q answered %s with HTTP %d %s", x.machine, op, code, http.StatusText(code))
		if said != "" {
			e.Message += " (T3: " + said + ")"
		}
	}
	return x.finish(e)
}

func orUnknown(s string) string {
	if s == "" {
		return "not given"
	}
	return s
}

func traceHint(id string) string {
	if id == "" {
		return "; see the T3 server log"
	}
	return "; see the T3 server log, trace " + id
}

// transport maps an error that came with no usable T3 answer: the caller's
// context ended, the HTTP timeout passed, or the network failed.
func (x *errs) transport(parent context.Context, op string, err error) *Error {
	e := &Error{Op: op, Err: err}
	switch {
	case parent.Err() != nil:
		e.Code, e.Err = CodeCanceled, parent.Err()
		e.Message = fmt.Sprintf("machine %q: %s: %v", x.machine, op, parent.Err())
	case errors.Is(err, context.DeadlineExceeded):
		e.Code = CodeTimeout
		e.Message = fmt.Sprintf("machine %q at %s is unreachable (no answer to %s within %v)", x.machine, x.where, op, x.timeout)
	default:
		e.Code = CodeUnreachable
		e.Message = fmt.Sprintf("machine %q at %s is unreachable (%s)", x.machine, x.where, netCause(err))
	}
	return x.finish(e)
}

// netCause is the innermost useful text of a network error: the *url.Error's
// cause ("dial tcp 127.0.0.1:1: connect: connection refused") without the
// request line around it.
func netCause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// rpcError maps an error of a call over the socket. Defect texts from T3's
// schema decoder span lines; they are flattened to keep messages one line.
func rpcError(machine, op string, err error, scrub func(string) string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller's own deadline or cancel; nothing about T3 to explain.
		return err
	}
	e := &Error{Machine: machine, Op: op, Err: err}
	var re *effectrpc.Error
	switch {
	case errors.Is(err, effectrpc.ErrClosed):
		e.Code = CodeConnectionLost
		e.Message = fmt.Sprintf("%s: the connection closed before %s was answered (%v)", onMachine(machine), op, err)
	case errors.As(err, &re):
		e.Tag, e.RequiredScope = re.Tag, re.RequiredScope
		switch {
		case re.Kind == effectrpc.KindFail && re.Tag == "EnvironmentAuthorizationError":
			e.Status, e.Code = http.StatusForbidden, "insufficient_scope"
			e.Message = scopeMissing(machine, re.RequiredScope, op)
		case re.Kind == effectrpc.KindFail && re.CommandID != "":
			e.Code = CodeRejected
			e.Message = fmt.Sprintf("%s rejected %s command %s: %s", onMachine(machine), orOp(re.CommandType, op), re.CommandID, re.Message)
		case re.Kind == effectrpc.KindFail:
			e.Code = CodeRejected
			e.Message = fmt.Sprintf("%s refused %s: %s: %s", onMachine(machine), op, re.Tag, re.Message)
		case re.Kind == effectrpc.KindDie:
			e.Code = CodeDefect
			e.Message = fmt.Sprintf("%s could not process %s (T3 defect: %s); T3 Code and t3code-mcp may disagree on the protocol",
				onMachine(machine), op, text.Snippet(re.Message, 500))
		case re.Kind == effectrpc.KindInterrupt:
			e.Code = CodeInterrupted
			e.Message = fmt.Sprintf("%s interrupted %s", onMachine(machine), op)
		default:
			e.Code = CodeProtocol
			e.Message = fmt.Sprintf("%s: %s: %v", onMachine(machine), op, re)
		}
	default:
		e.Message = fmt.Sprintf("%s: %s: %v", onMachine(machine), op, err)
	}
	if scrub != nil {
		e.Message = scrub(e.Message)
	}
	return e
}

func orOp(s, op string) string {
	if s != "" {
		return s
	}
	return op
}
