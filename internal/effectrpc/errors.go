package effectrpc

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// ErrClosed is wrapped by every error caused by the socket going away: Close,
// a lost or dead socket, a connection-level Defect. A request that fails with it
// may or may not have reached T3, so callers with idempotent requests (commands
// carry a commandId) can resend them on a new connection.
var ErrClosed = errors.New("effectrpc: connection closed")

// Kinds of *Error.
const (
	// KindFail is a typed failure (Exit cause Fail): T3 understood the request and
	// refused it; Tag is the error class, e.g. OrchestrationV2DispatchCommandError.
	KindFail = "fail"
	// KindDie is an Exit cause Die: a payload T3 could not decode, an unknown
	// method or a server bug. Message is T3's defect text.
	KindDie = "die"
	// KindInterrupt is an Exit cause Interrupt: T3 interrupted the request.
	KindInterrupt = "interrupt"
	// KindDefect is a connection-level Defect frame; the socket is closed.
	KindDefect = "defect"
	// KindProtocol covers ClientProtocolError frames and replies this client
	// could not decode.
	KindProtocol = "protocol"
)

// Error is a request that T3 ended with a failure, or a protocol-level failure
// that ended it. Error() always carries T3's own message.
type Error struct {
	Kind string
	// Method is the RPC method of the failed request (empty for KindDefect).
	Method string
	// Tag is the error class for KindFail (and the defect's name when T3 gave one).
	Tag           string
	Message       string
	RequiredScope string
	CommandID     string
	CommandType   string
	Detail        string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Method != "" {
		b.WriteString(e.Method)
		b.WriteString(": ")
	}
	switch e.Kind {
	case KindFail:
		b.WriteString(e.Tag)
		if e.Message != "" {
			b.WriteString(": ")
			b.WriteString(e.Message)
		}
	case KindDie:
		b.WriteString("T3 could not handle the request (defect): ")
		b.WriteString(e.Message)
	case KindInterrupt:
		b.WriteString("interrupted by T3")
		if e.Message != "" {
			b.WriteString(": ")
			b.WriteString(e.Message)
		}
	case KindDefect:
		b.WriteString("T3 reported a connection defect: ")
		b.WriteString(e.Message)
	default:
		b.WriteString("protocol error: ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// UpgradeError is a WebSocket handshake that T3 answered with something other
// than 101 Switching Protocols.
type UpgradeError struct {
	Status int
	// Body is the start of T3's answer (at most a few KiB), usually a JSON error
	// body such as {"_tag":"EnvironmentAuthInvalidError","reason":"invalid_credential",…}.
	Body []byte
}

func (e *UpgradeError) Error() string {
	said := describeBody(e.Body)
	switch e.Status {
	case http.StatusUnauthorized:
		return "effectrpc: T3 refused the WebSocket upgrade (401 Unauthorized): the ticket or token is missing, invalid or expired" + said
	case http.StatusUpgradeRequired:
		return "effectrpc: T3 refused the WebSocket upgrade (426 Upgrade Required): it speaks a different orchestration protocol than this client asked for" + said
	default:
		return fmt.Sprintf("effectrpc: T3 answered the WebSocket upgrade with HTTP %d %s instead of 101%s",
			e.Status, http.StatusText(e.Status), said)
	}
}

// describeBody renders T3's error body for a message: its message/reason fields
// when it is JSON, else a short printable prefix.
func describeBody(body []byte) string {
	if len(body) == 0 {
		return ""
	}
	var msg, reason string
	d := jx.DecodeBytes(body)
	if d.Next() == jx.Object {
		_ = d.ObjBytes(func(d *jx.Decoder, k []byte) error {
			if d.Next() != jx.String {
				return d.Skip()
			}
			v, err := d.Str()
			switch string(k) {
			case "message":
				msg = v
			case "reason":
				reason = v
			}
			return err
		})
	}
	switch {
	case msg != "" && reason != "":
		return fmt.Sprintf(" (T3: %s: %s)", reason, msg)
	case msg != "":
		return " (T3: " + msg + ")"
	case reason != "":
		return " (T3: " + reason + ")"
	}
	return " (T3: " + text.Snippet(string(body), 200) + ")"
}

// exitError maps a Failure exit to an *Error. Effect puts every failure of the
// fiber in the cause list; the typed Fail is the one that says what went wrong,
// a Die explains a crash, and an Interrupt alone means the request was cancelled.
func exitError(method string, f t3rpc.ExitFailure) *Error {
	pick := -1
	for _, want := range []string{"Fail", "Die", "Interrupt"} {
		for i, c := range f.Cause {
			if c.Tag == want {
				pick = i
				break
			}
		}
		if pick >= 0 {
			break
		}
	}
	if pick < 0 {
		if len(f.Cause) == 0 {
			return &Error{Kind: KindProtocol, Method: method, Message: "T3 sent a Failure exit with an empty cause"}
		}
		// An unknown cause tag from a newer T3: report it as a defect with what it says.
		c := f.Cause[0]
		return &Error{Kind: KindDie, Method: method, Tag: c.Tag, Message: defectMessage(c.Defect)}
	}
	c := f.Cause[pick]
	switch c.Tag {
	case "Fail":
		e := &Error{Kind: KindFail, Method: method}
		if te, ok := c.Error.Get(); ok {
			e.Tag = te.Tag
			e.Message = te.Message.Or("")
			e.RequiredScope = te.RequiredScope.Or("")
			e.CommandID = te.CommandId.Or("")
			e.CommandType = te.CommandType.Or("")
			e.Detail = te.Detail.Or("")
		}
		if e.Tag == "" {
			e.Tag = "UnknownError"
		}
		return e
	case "Die":
		e := &Error{Kind: KindDie, Method: method, Message: defectMessage(c.Defect)}
		e.Tag = defectName(c.Defect)
		return e
	default:
		return &Error{Kind: KindInterrupt, Method: method}
	}
}

// defectMessage renders an Effect defect, which is a string, an object with
// message (and maybe name, stack), or anything else.
func defectMessage(raw jx.Raw) string {
	if len(raw) == 0 {
		return "(no detail)"
	}
	d := jx.DecodeBytes(raw)
	switch d.Next() {
	case jx.String:
		if s, err := d.Str(); err == nil {
			return s
		}
	case jx.Object:
		var msg string
		_ = d.ObjBytes(func(d *jx.Decoder, k []byte) error {
			if string(k) == "message" && d.Next() == jx.String {
				v, err := d.Str()
				msg = v
				return err
			}
			return d.Skip()
		})
		if msg != "" {
			return msg
		}
	}
	return text.Snippet(string(raw), 500)
}

// defectName returns the "name" of an object defect (e.g. "TypeError"), if any.
func defectName(raw jx.Raw) string {
	d := jx.DecodeBytes(raw)
	if d.Next() != jx.Object {
		return ""
	}
	var name string
	_ = d.ObjBytes(func(d *jx.Decoder, k []byte) error {
		if string(k) == "name" && d.Next() == jx.String {
			v, err := d.Str()
			name = v
			return err
		}
		return d.Skip()
	})
	return name
}

// redactedError hides the query of the dialed URL (it carries the single-use
// wsTicket credential) from an error message while keeping the chain for
// errors.Is/As.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact replaces every occurrence of rawURL's query string in err's message.
func redact(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil {
		// An unparsable URL cannot be printed safely at all.
		return &redactedError{msg: "effectrpc: invalid WebSocket URL", err: err}
	}
	msg := err.Error()
	if u.RawQuery != "" {
		msg = strings.ReplaceAll(msg, u.RawQuery, "REDACTED")
	}
	if u.User != nil {
		msg = strings.ReplaceAll(msg, u.User.String(), "REDACTED")
	}
	return &redactedError{msg: msg, err: err}
}

// safeURL is rawURL without credentials or query, for messages and logs.
func safeURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(invalid URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
