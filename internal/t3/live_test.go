package t3

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// TestLive runs the client against a real T3 server, opt-in:
//
//	T3CODE_MCP_LIVE_URL=http://127.0.0.1:3773 T3CODE_MCP_LIVE_TOKEN_FILE=~/.t3-token \
//	T3CODE_MCP_LIVE_PROJECT=my-repo go test -run TestLive -v ./internal/t3/
//
// Without T3CODE_MCP_LIVE_URL it is skipped. It runs the handshake, the reads,
// a shell subscription, and (when T3CODE_MCP_LIVE_PROJECT is set) one real
// dispatch, which costs what a real run costs.
func TestLive(t *testing.T) {
	url := os.Getenv("T3CODE_MCP_LIVE_URL")
	if url == "" {
		t.Skip("set T3CODE_MCP_LIVE_URL and T3CODE_MCP_LIVE_TOKEN_FILE to run against a real T3 server")
	}
	b, err := os.ReadFile(os.Getenv("T3CODE_MCP_LIVE_TOKEN_FILE"))
	if err != nil {
		t.Fatalf("T3CODE_MCP_LIVE_TOKEN_FILE: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := NewClient("live", url, strings.TrimSpace(string(b)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Handshake(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("T3 Code %s, protocol %d, environment %q", d.ServerVersion, d.Protocol, d.Label)
	s, err := c.Session(ctx)
	if err != nil || !s.Authenticated {
		t.Fatalf("session: %+v %v", s, err)
	}
	t.Logf("scopes: %v", s.Scopes)
	if _, err := c.Shell(ctx); err != nil {
		t.Fatal(err)
	}
	projects, err := c.Projects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.DialRPC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg, err := c.GetConfig(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	synced := make(chan struct{})
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	statuses := make(chan t3rpc.ThreadShell, 256)
	go func() {
		once := false
		_ = conn.Stream(sctx, "orchestration.subscribeShell", &t3rpc.SubscribeShellInput{RequestCompletionMarker: t3rpc.NewOptBool(true)}, func(values []jx.Raw) error {
			for _, v := range values {
				var it t3rpc.ShellStreamItem
				if err := it.Decode(jx.DecodeBytes(v)); err != nil {
					t.Errorf("shell item does not decode: %v", err)
					continue
				}
				if it.Kind == "synchronized" && !once {
					once = true
					close(synced)
				}
				if th, ok := it.Thread.Get(); ok {
					select {
					case statuses <- th:
					default:
					}
				}
			}
			return nil
		})
	}()
	select {
	case <-synced:
	case <-ctx.Done():
		t.Fatal("shell subscription never synchronized")
	}
	ref := os.Getenv("T3CODE_MCP_LIVE_PROJECT")
	if ref == "" {
		t.Log("T3CODE_MCP_LIVE_PROJECT unset: skipping the dispatch")
		return
	}
	var pid string
	for _, p := range projects {
		if p.ID == ref || p.Title == ref || p.WorkspaceRoot == ref {
			pid = p.ID
		}
	}
	if pid == "" {
		t.Fatalf("project %q not found", ref)
	}
	var model t3rpc.ModelSelection
	for _, p := range cfg.Providers {
		if p.Enabled.Or(true) && p.Status.Or("ready") == "ready" && len(p.Models) > 0 {
			model = t3rpc.ModelSelection{InstanceId: p.InstanceId, Model: p.Models[0].Slug}
			break
		}
	}
	connect := func(context.Context) (*effectrpc.Conn, error) { return conn, nil }
	tid := NewID("thread")
	if _, err := Dispatch(ctx, connect, ThreadCreate(tid, pid, "t3code-mcp live test", model)); err != nil {
		t.Fatal(err)
	}
	if _, err := Dispatch(ctx, connect, MessageDispatch(tid, NewID("msg"), "Reply with the word hello.", "live test")); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case <-ctx.Done():
			t.Fatal("the run did not settle")
		case th := <-statuses:
			if th.ID == tid && (th.Status == "completed" || th.Status == "failed" || th.Status == "interrupted") {
				t.Logf("run settled: %s", th.Status)
				return
			}
		}
	}
}
