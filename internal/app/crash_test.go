package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// TestKill9LosesNoEvent builds the real binary and kills it with SIGKILL at
// random moments while runs settle on the fake T3; after the last restart
// every run's event has reached the webhook receiver, and any repeat carries
// the same webhook-id.
func TestKill9LosesNoEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts the binary")
	}
	bin := filepath.Join(t.TempDir(), "t3code-mcp")
	build := exec.Command("go", "build", "-o", bin, "github.com/t3code-mcp/t3code-mcp/cmd/t3code-mcp")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: 8 * time.Millisecond})
	fk.AddProject("api", "/srv/api")

	type key struct{ thread, typ, run string }
	var mu sync.Mutex
	ids := map[key]map[string]bool{} // a transition → the webhook ids it arrived under
	hook := newReceiver(t)
	stop := make(chan struct{})
	collected := make(chan struct{})
	defer func() { close(stop); <-collected }()
	go func() {
		defer close(collected)
		for {
			var d delivery
			select {
			case d = <-hook.ch:
			case <-stop:
				return
			}
			k := key{str(d.event, "thread_id"), str(d.event, "type"), str(d.event, "run_id")}
			mu.Lock()
			if ids[k] == nil {
				ids[k] = map[string]bool{}
			}
			ids[k][d.header.Get("webhook-id")] = true
			mu.Unlock()
		}
	}()

	dir := t.TempDir()
	cfg := filepath.Join(dir, "t3code.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = \"T3CODE_MCP_CRASH_TOKEN\"\n", fk.URL())), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	env := append(os.Environ(),
		"T3CODE_MCP_CONFIG="+cfg, "T3CODE_MCP_STATE_DIR="+filepath.Join(dir, "state"),
		"T3CODE_MCP_PORT="+fmt.Sprint(port), "T3CODE_MCP_HOOK_URL="+hook.srv.URL,
		"T3CODE_MCP_CRASH_TOKEN="+fk.Token(), "T3CODE_MCP_LOG_LEVEL=warn")
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	startProc := func() *exec.Cmd {
		cmd := exec.Command(bin, "serve")
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = nil, nil
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitReady(t, base)
		return cmd
	}
	want := map[string]string{} // thread → event type
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 5; round++ {
		proc := startProc()
		c := dial(t, base)
		dispatchSome(t, c, rng, 6, want)
		c.Close()
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		_ = proc.Process.Signal(syscall.SIGKILL)
		_ = proc.Wait()
	}
	final := startProc()
	defer func() { _ = final.Process.Signal(syscall.SIGKILL); _ = final.Wait() }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for tid, typ := range want {
			found := false
			for k := range ids {
				found = found || (k.thread == tid && k.typ == typ)
			}
			if !found {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs never produced their event", missing, len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let late repeats land
	mu.Lock()
	defer mu.Unlock()
	perThread := map[string]int{}
	for k, webhookIDs := range ids {
		if len(webhookIDs) != 1 {
			t.Errorf("%+v delivered under %d different webhook-ids: %v", k, len(webhookIDs), webhookIDs)
		}
		perThread[k.thread]++
	}
	for tid := range want {
		if perThread[tid] != 1 {
			t.Errorf("thread %s: %d distinct events, want 1", tid, perThread[tid])
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			var h map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if h["ok"] == true {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("connector never became ready")
}

func dial(t *testing.T, base string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "crash-test", Version: "1"}, nil)
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: base + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func callTool(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("%s: %v", name, res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}
