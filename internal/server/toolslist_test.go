package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/server"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// listTools is the tools/list result a client receives, as JSON.
func listTools(t *testing.T, readOnly bool) ([]byte, []*mcp.Tool) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slog.New(slog.DiscardHandler)
	f := fleet.New(&config.Config{}, st, fleet.Options{Logger: log})
	srv := server.NewMCPServer(&tools.Deps{Fleet: f, Threads: st, Keys: store.DispatchKeys{Store: st}, Logger: log, ReadOnly: readOnly}, "test")
	ct, stt := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := srv.Connect(ctx, stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "size", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return b, res.Tools
}

// tools/list sits in the context of every agent that connects, on every
// turn: its size is a cost paid by every client.
const (
	// toolsListCeiling is the most it may ever be (issue 14: under 16 KB).
	toolsListCeiling = 16 << 10
	// toolsListMeasured is its size now. A change that makes it grow by more
	// than 2% fails here until this figure (and docs/clients.md) is updated:
	// growth is a decision, not an accident.
	toolsListMeasured = 15239
)

// TestToolsListSize measures tools/list as a client receives it, in bytes
// and approximate tokens (bytes/4), and holds it to the figures above.
// T3CODE_MCP_DUMP_TOOLS=file writes it out for a closer look.
func TestToolsListSize(t *testing.T) {
	b, ts := listTools(t, false)
	out := 0
	for _, tl := range ts {
		o, _ := json.Marshal(tl.OutputSchema)
		out += len(o)
	}
	if p := os.Getenv("T3CODE_MCP_DUMP_TOOLS"); p != "" {
		_ = os.WriteFile(p, b, 0o644)
	}
	t.Logf("tools/list: %d bytes (~%d tokens), %d tools, output schemas %d bytes", len(b), len(b)/4, len(ts), out)
	if len(b) > toolsListCeiling {
		t.Errorf("tools/list is %d bytes, over the ceiling of %d: shorten descriptions (schema/mcp/tools.json) or describe shared definitions once (x-describedIn)", len(b), toolsListCeiling)
	}
	if len(b) > toolsListMeasured*102/100 {
		t.Errorf("tools/list grew from %d to %d bytes (~%d tokens in every agent's context): if that is deliberate, set toolsListMeasured to %d here and update the figure in docs/clients.md", toolsListMeasured, len(b), len(b)/4, len(b))
	}
	// The structured output stays declared: every tool has an output schema
	// with properties or a pointer to the one that describes them.
	for _, tl := range ts {
		o, _ := json.Marshal(tl.OutputSchema)
		if !strings.Contains(string(o), `"properties"`) && !strings.Contains(string(o), "output schema") {
			t.Errorf("%s: output schema %s declares nothing", tl.Name, o)
		}
	}

	// Read-only: the mutating tools are not even listed.
	rb, rts := listTools(t, true)
	var names, want []string
	for _, tl := range rts {
		names = append(names, tl.Name)
	}
	for _, tl := range ts {
		if tl.Name != "t3_dispatch" && tl.Name != "t3_answer" && tl.Name != "t3_interrupt" {
			want = append(want, tl.Name)
		}
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) || slices.Contains(names, "t3_dispatch") {
		t.Errorf("read-only tools/list = %v, want %v", names, want)
	}
	t.Logf("read-only tools/list: %d bytes (~%d tokens)", len(rb), len(rb)/4)
}
