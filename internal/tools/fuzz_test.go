package tools_test

// Fuzz targets for every tool's argument handling. Each feeds arbitrary bytes
// to the tool's generated input decoder (and its validation): it must return
// an error or a value, never panic, and what it accepts must encode and decode
// again to the same thing. Inputs that are JSON objects then go through a real
// MCP session to the registered tool (generated decoder, validation, the
// handler, over a fleet with an offline, a read-only and a misconfigured
// machine): the answer must be a tool result, never a recovered panic.
//
// `go test` runs the seeds; `make fuzz` (scripts/fuzz) fuzzes each target.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

type input interface {
	UnmarshalJSON([]byte) error
	MarshalJSON() ([]byte, error)
}

// Seeds shared by every target: shapes an agent (or an attacker) sends.
var commonSeeds = []string{
	`{}`, `null`, `[]`, `""`, `0`, `{"":""}`,
	`{"machine":"mac"}`, `{"machine":"ro","project":"api","prompt":"go"}`,
	`{"thread_id":"thread-1"}`, `{"thread_id":"../../etc/passwd"}`, `{"thread_id":"a%2Fb"}`,
	`{"thread_id":42}`, `{"thread_id":null}`, `{"thread_id":"\u0000"}`, `{"thread_id":"\ud800"}`,
	`{"machine":"мак","project":"プロジェクト","prompt":"🚀"}`,
	`{"machine":{"a":[1,2,{"b":null}]}}`,
	`{"thread_id":"x","x":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}`,
	`{"thread_id":"x","thread_id":"y"}`,
	`{"thread_id":"x"` /* truncated */, `{"thread_id":"x",}`, "{\"thread_id\":\"\xff\xfe\"}",
}

var toolSeeds = map[string][]string{
	mcptools.ToolProjects: {`{"machine":"nokey"}`, `{"machine":""}`, `{"machine":"  "}`},
	mcptools.ToolDispatch: {
		`{"machine":"mac","project":"api","prompt":"write the docs"}`,
		`{"machine":"mac","project":"api","prompt":"x","title":"t","model":"codex/gpt","thread_id":"thread-1","watch":false}`,
		`{"machine":"mac","project":"api","prompt":"  "}`,
		`{"machine":"nokey","project":"api","prompt":"x"}`,
		`{"machine":"mac","project":"api","prompt":"x","watch":"yes"}`,
		`{"machine":"mac","project":"api","prompt":"a\u0000b"}`,
	},
	mcptools.ToolThreads: {`{"machine":"mac","project":"api","status":"busy","query":"zebra","archived":true,"limit":5,"cursor":"5"}`, `{"machine":"mac","limit":0}`, `{"machine":"mac","cursor":"-1"}`, `{"machine":"mac","query":"z"}`},
	mcptools.ToolThread:  {`{"thread_id":"t","diff":true,"run_id":"r"}`, `{"thread_id":"t","turns":3}`, `{"thread_id":"t","turns":0}`, `{"thread_id":"t","turns":1e9}`, `{"thread_id":"t","turns":-1}`},
	mcptools.ToolWait:    {`{"thread_ids":["a","b","a"],"timeout":1}`, `{"thread_ids":[]}`, `{"thread_ids":[1]}`, `{"thread_id":"t","thread_ids":["u"]}`, `{"thread_id":"t","timeout":1}`, `{"thread_id":"t","timeout":0}`, `{"thread_id":"t","timeout":3601}`, `{"thread_id":"t","timeout":1.5}`, `{"thread_id":"t","timeout":"10"}`},
	mcptools.ToolAnswer: {
		`{"thread_id":"t","answers":{"scope":"Workspace","checks":["lint","test"]}}`,
		`{"thread_id":"t","answers":{}}`, `{"thread_id":"t","answers":{"q":5}}`, `{"thread_id":"t","answers":{"q":[1]}}`,
		`{"thread_id":"t","answers":{"q":{"a":"b"}}}`, `{"thread_id":"t","answers":"x"}`, `{"thread_id":"t","answers":{"q":[]}}`,
		`{"thread_id":"t","answers":{"q":null}}`, `{"thread_id":"t","answers":{"q":["a",null]}}`,
	},
	mcptools.ToolInterrupt: {`{"thread_id":"t","reason":"x"}`},
	mcptools.ToolWatch:     {`{"thread_id":"t","enabled":true}`, `{"thread_id":"t"}`, `{"enabled":false}`, `{"thread_id":"t","enabled":"no"}`},
}

var inputs = map[string]func() input{
	mcptools.ToolMachines:  func() input { return new(mcptools.MachinesInput) },
	mcptools.ToolProjects:  func() input { return new(mcptools.ProjectsInput) },
	mcptools.ToolDispatch:  func() input { return new(mcptools.DispatchInput) },
	mcptools.ToolThread:    func() input { return new(mcptools.ThreadInput) },
	mcptools.ToolWait:      func() input { return new(mcptools.WaitInput) },
	mcptools.ToolAnswer:    func() input { return new(mcptools.AnswerInput) },
	mcptools.ToolInterrupt: func() input { return new(mcptools.InterruptInput) },
	mcptools.ToolWatch:     func() input { return new(mcptools.WatchInput) },
	mcptools.ToolThreads:   func() input { return new(mcptools.ThreadsInput) },
}

// Every declared tool has a fuzz target below.
func TestEveryToolIsFuzzed(t *testing.T) {
	for _, s := range mcptools.Tools {
		if inputs[s.Name] == nil {
			t.Errorf("tool %s has no fuzz target", s.Name)
		}
	}
}

func FuzzMachinesArgs(f *testing.F)  { fuzzTool(f, mcptools.ToolMachines) }
func FuzzProjectsArgs(f *testing.F)  { fuzzTool(f, mcptools.ToolProjects) }
func FuzzDispatchArgs(f *testing.F)  { fuzzTool(f, mcptools.ToolDispatch) }
func FuzzThreadArgs(f *testing.F)    { fuzzTool(f, mcptools.ToolThread) }
func FuzzWaitArgs(f *testing.F)      { fuzzTool(f, mcptools.ToolWait) }
func FuzzAnswerArgs(f *testing.F)    { fuzzTool(f, mcptools.ToolAnswer) }
func FuzzInterruptArgs(f *testing.F) { fuzzTool(f, mcptools.ToolInterrupt) }
func FuzzWatchArgs(f *testing.F)     { fuzzTool(f, mcptools.ToolWatch) }
func FuzzThreadsArgs(f *testing.F)   { fuzzTool(f, mcptools.ToolThreads) }

func fuzzTool(f *testing.F, tool string) {
	for _, s := range append(append([]string{}, commonSeeds...), toolSeeds[tool]...) {
		f.Add([]byte(s))
	}
	newInput := inputs[tool]
	session, logs := toolSession(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecoder(t, newInput, data)
		if !json.Valid(data) || !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
			return // the MCP client only sends JSON objects as arguments
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(data)})
		if err != nil {
			// The SDK may refuse what it cannot re-encode (duplicate keys
			// collapse, invalid UTF-8 is replaced); that is not the tool's.
			if strings.Contains(err.Error(), "closed") {
				t.Fatalf("%s: the session broke: %v", tool, err)
			}
			return
		}
		text := ""
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		if text == "" {
			t.Fatalf("%s(%s): empty result", tool, data)
		}
		if strings.Contains(text, "internal error") || strings.Contains(logs.String(), "tool panicked") {
			t.Fatalf("%s(%s) panicked: %s\n%s", tool, data, text, logs.String())
		}
	})
}

// checkDecoder decodes data into the tool's generated input type and runs its
// validation; accepted input must survive encoding and decoding again.
func checkDecoder(t *testing.T, newInput func() input, data []byte) {
	t.Helper()
	in := newInput()
	if in.UnmarshalJSON(data) != nil {
		return
	}
	if v, ok := in.(interface{ Validate() error }); ok {
		_ = v.Validate()
	}
	enc, err := in.MarshalJSON()
	if err != nil {
		t.Fatalf("accepted %q but cannot encode it: %v", data, err)
	}
	again := newInput()
	if err := again.UnmarshalJSON(enc); err != nil {
		t.Fatalf("accepted %q, encoded %q, which does not decode: %v", data, enc, err)
	}
	enc2, err := again.MarshalJSON()
	var v1, v2 any
	if err != nil || json.Unmarshal(enc, &v1) != nil || json.Unmarshal(enc2, &v2) != nil || !reflect.DeepEqual(v1, v2) {
		// Compared as JSON values: maps (answers) encode in any key order.
		t.Fatalf("round trip of %q changed it: %q then %q (%v)", data, enc, enc2, err)
	}
}

// lockedBuffer collects log output from the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// toolSession registers the tools over a fleet that needs no network — "mac"
// (offline: nothing listens on its port and its watcher is not started),
// "ro" (read-only) and "nokey" (its token variable is unset) — and returns a
// connected in-memory MCP client session.
func toolSession(f *testing.F) (*mcp.ClientSession, *lockedBuffer) {
	f.Helper()
	f.Setenv("T3CODE_MCP_FUZZ_TOKEN", "fuzz-token-0123456789")
	cfg, err := config.Parse([]byte(`
[machines.mac]
url = "http://127.0.0.1:1"
token_env = "T3CODE_MCP_FUZZ_TOKEN"
projects = ["api"]
[machines.ro]
url = "http://127.0.0.1:1"
token_env = "T3CODE_MCP_FUZZ_TOKEN"
access = "read"
[machines.nokey]
url = "http://127.0.0.1:1"
token_env = "T3CODE_MCP_FUZZ_UNSET"
`), "fuzz.toml")
	if err != nil {
		f.Fatal(err)
	}
	st, err := store.Open(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d := &tools.Deps{Fleet: fleet.New(cfg, st, fleet.Options{Logger: log, HTTPTimeout: time.Second}), Threads: st, Keys: store.DispatchKeys{Store: st}, Logger: log,
		Limits: tools.Limits{CallTimeout: 2 * time.Second, MaxWait: time.Minute}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "fuzz", Version: "1"}, nil)
	tools.Register(srv, d)
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), stt, nil)
	if err != nil {
		f.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fuzz", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		cs.Close()
		ss.Close()
		st.Close()
	})
	return cs, logs
}
