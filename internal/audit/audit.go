// Package audit keeps the audit log: one JSON line per call of a tool that
// changes something on a T3 machine (t3_dispatch, t3_answer, t3_interrupt),
// appended to <state dir>/audit.log and rotated by size (Log), or, when replicas share
// PostgreSQL, to the database's t3_audit table through a bounded buffer (Shared).
//
// A line says who asked (origin, MCP client), what for (tool, machine,
// project, thread, run or request), whether a person approved it, and how it
// ended. It never holds a prompt (only its SHA-256 and a short prefix) nor a
// token. `t3code-mcp audit` reads it back (see Scan and Print).
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// FileName is the log's name in the state directory; rotated files get .1,
// .2, … (.1 the most recent).
const FileName = "audit.log"

// Defaults for Options.
const (
	DefaultMaxBytes = 10 << 20 // T3CODE_MCP_AUDIT_MAX_BYTES
	DefaultKeep     = 3        // T3CODE_MCP_AUDIT_KEEP
)

// PromptPrefixChars is how much of a prompt a line keeps in clear.
const PromptPrefixChars = 80

// maxErrorChars bounds the error message a line keeps.
const maxErrorChars = 2000

// Approval outcomes: whether a person was asked, and what they said.
const (
	NotRequired = "not_required" // the machine's approve list does not name the action
	Accepted    = "accepted"     // asked; the person approved
	Declined    = "declined"     // asked; the person declined (or accepted the form without ticking approve)
	Cancelled   = "cancelled"    // asked; the person dismissed the question without a decision
	Unsupported = "unsupported"  // approval needed, but the MCP client cannot ask (no elicitation support)
	Requested   = "requested"    // asked through an input request; the client's retry is a second line
	Failed      = "failed"       // the question could not be asked or its answer was unusable
	NotReached  = "not_reached"  // the call failed before its approval step (bad arguments, read-only machine, …)
)

// Results.
const (
	ResultOK            = "ok"
	ResultError         = "error"
	ResultInputRequired = "input_required" // the call returned an approval question to the client
)

// Client is the MCP client as it named itself when it connected.
type Client struct {
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
}

// Record is one line of the log.
type Record struct {
	Time    time.Time `json:"time"`
	Tool    string    `json:"tool"`
	Machine string    `json:"machine,omitempty"`
	Project string    `json:"project,omitempty"` // title
	Thread  string    `json:"thread,omitempty"`
	Run     string    `json:"run,omitempty"`     // t3_interrupt: the run interrupted
	Request string    `json:"request,omitempty"` // t3_answer: the runtime request answered
	Model   string    `json:"model,omitempty"`   // t3_dispatch: instanceId/model when chosen
	Origin  string    `json:"origin,omitempty"`
	Client  Client    `json:"client"`
	// Replica is the connector replica that served the call (replicas sharing PostgreSQL).
	Replica string `json:"replica,omitempty"`

	Approval string `json:"approval"`
	Result   string `json:"result"`
	Error    string `json:"error,omitempty"`

	PromptSHA256 string `json:"prompt_sha256,omitempty"`
	PromptPrefix string `json:"prompt_prefix,omitempty"`
	PromptChars  int    `json:"prompt_chars,omitempty"`

	Millis int64 `json:"ms"`
}

// SetPrompt records a prompt as its SHA-256, its length in characters and
// its first PromptPrefixChars characters — never the whole of it.
func (r *Record) SetPrompt(prompt string) {
	sum := sha256.Sum256([]byte(prompt))
	r.PromptSHA256 = hex.EncodeToString(sum[:])
	r.PromptChars = utf8.RuneCountInString(prompt)
	r.PromptPrefix = text.Cut(prompt, PromptPrefixChars)
}

// SetError records err's message, shortened when very long.
func (r *Record) SetError(msg string) {
	r.Result = ResultError
	r.Error = text.Cut(msg, maxErrorChars)
}

// Line is the record as the log stores it: one JSON object, no newline, its Time in UTC (a
// zero Time is set to now). The file and the database table hold the same bytes.
func (r Record) Line() ([]byte, error) {
	r = r.normalized()
	line, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return line, nil
}

func (r Record) normalized() Record {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	return r
}

// Writer is the audit log as the connector writes it: the file (Log) or the shared database
// table (Shared).
type Writer interface {
	Write(Record) error
	Close() error
}

var (
	_ Writer = (*Log)(nil)
	_ Writer = (*Shared)(nil)
)

// Options bound the log's size on disk.
type Options struct {
	MaxBytes int64 // rotate before a line would take the file past this; default DefaultMaxBytes
	Keep     int   // rotated files kept besides audit.log; default DefaultKeep
}

// Log appends records to <dir>/audit.log. It is safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	path string
	opts Options
	f    *os.File
	size int64
}

// Open opens (creating) the log in dir.
func Open(dir string, o Options) (*Log, error) {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Keep <= 0 {
		o.Keep = DefaultKeep
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	l := &Log{path: filepath.Join(dir, FileName), opts: o}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

// Path is the current log file.
func (l *Log) Path() string { return l.path }

func (l *Log) open() error {
	// O_APPEND: every Write below is one write(2) of one whole line, so lines
	// never interleave or tear, whoever else appends.
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Write appends r as one line, rotating first when the line would take the
// file past MaxBytes. A zero Time is set to now.
func (l *Log) Write(r Record) error {
	line, err := r.Line()
	if err != nil {
		return err
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return errors.New("audit log: closed")
	}
	var rerr error
	if l.size > 0 && l.size+int64(len(line)) > l.opts.MaxBytes {
		// A failed rotation still leaves a file to write to when it can:
		// the line matters more than the size bound.
		if rerr = l.rotate(); l.f == nil {
			return rerr
		}
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return rerr
}

// rotate shifts audit.log.(k-1) to audit.log.k down to audit.log →
// audit.log.1, dropping what was audit.log.Keep, and starts a new audit.log.
func (l *Log) rotate() error {
	cerr := l.f.Close()
	l.f = nil
	var rerr error
	for k := l.opts.Keep; k >= 1 && rerr == nil; k-- {
		if err := os.Rename(rotated(l.path, k-1), rotated(l.path, k)); err != nil && !errors.Is(err, os.ErrNotExist) {
			rerr = fmt.Errorf("audit log: rotating: %w", err)
		}
	}
	if err := l.open(); err != nil {
		return errors.Join(rerr, err)
	}
	if cerr != nil {
		rerr = errors.Join(rerr, fmt.Errorf("audit log: %w", cerr))
	}
	return rerr
}

// rotated names the k-th rotated file; 0 is the current one.
func rotated(path string, k int) string {
	if k == 0 {
		return path
	}
	return fmt.Sprintf("%s.%d", path, k)
}

// Close closes the file; later writes fail.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
