package app_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// TestKill9BetweenCommitAndEnrichment: the runs fail, so their events are
// committed in the watcher's Ack path with the rows' facts only (a failure's
// error is not on the row; a plain completion's reply is, and needs no read:
// TestPlainCompletionNeedsNoThreadRead), and the thread reads that would
// complete them hang. The real binary is killed with SIGKILL while the
// enrichment reads are in flight; after a restart (reads answering again)
// each event is delivered once, complete, under the webhook-id it was
// committed with.
func TestKill9BetweenCommitAndEnrichment(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts the binary")
	}
	bin := filepath.Join(t.TempDir(), "t3code-mcp")
	build := exec.Command("go", "build", "-o", bin, "github.com/t3code-mcp/t3code-mcp/cmd/t3code-mcp")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	hook := newReceiver(t)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "t3code.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = \"T3CODE_MCP_CRASH_TOKEN\"\n", fk.URL())), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	stateDir := filepath.Join(dir, "state")
	env := append(os.Environ(),
		"T3CODE_MCP_CONFIG="+cfg, "T3CODE_MCP_STATE_DIR="+stateDir,
		"T3CODE_MCP_PORT="+fmt.Sprint(port), "T3CODE_MCP_HOOK_URL="+hook.srv.URL,
		"T3CODE_MCP_CRASH_TOKEN="+fk.Token(), "T3CODE_MCP_LOG_LEVEL=warn",
		"T3CODE_MCP_HOOK_ENRICH_TIMEOUT=10m") // never partial here: the details must come
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	startProc := func() *exec.Cmd {
		cmd := exec.Command(bin, "serve")
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitReady(t, base)
		return cmd
	}

	proc := startProc()
	c := dial(t, base)
	var threads []string
	for i := range 4 {
		res := callTool(t, c, "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": fmt.Sprintf("fail the job #%d", i)})
		threads = append(threads, str(res, "thread_id"))
	}
	c.Close()
	for _, tid := range threads {
		fk.HangThreadReads(tid, true)
	}
	fk.StepAll()
	// Committed (the outbox counts them pending) but not deliverable: every
	// enrichment read hangs.
	deadline := time.Now().Add(30 * time.Second)
	for pendingEvents(t, base) < len(threads) {
		if time.Now().After(deadline) {
			t.Fatalf("the runs' events were never committed: %d pending", pendingEvents(t, base))
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = proc.Process.Signal(syscall.SIGKILL)
	_ = proc.Wait()
	select {
	case d := <-hook.ch:
		t.Fatalf("delivered before the details could be read: %v", d.event)
	default:
	}

	// What was committed before the kill: the ids the receiver must see.
	st, err := store.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := st.Pending(0)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	var wantIDs []string
	for _, e := range committed {
		if !e.Enrich {
			t.Fatalf("event %s committed without the enrichment mark", e.ID)
		}
		wantIDs = append(wantIDs, e.ID)
	}
	sort.Strings(wantIDs)

	for _, tid := range threads {
		fk.HangThreadReads(tid, false)
	}
	final := startProc()
	defer func() { _ = final.Process.Signal(syscall.SIGKILL); _ = final.Wait() }()

	got := map[string]int{} // webhook-id → deliveries
	byThread := map[string]int{}
	timeout := time.After(60 * time.Second)
	for len(got) < len(threads) {
		select {
		case d := <-hook.ch:
			id := d.header.Get("webhook-id")
			got[id]++
			byThread[str(d.event, "thread_id")]++
			if d.event["type"] != "thread.failed" || !strings.Contains(str(d.event, "error"), "Simulated provider failure: fail the job") || d.event["partial"] != nil {
				t.Errorf("event not completed from T3: %v", d.event)
			}
		case <-timeout:
			t.Fatalf("only %d of %d events delivered after the restart: %v", len(got), len(threads), got)
		}
	}
	var gotIDs []string
	for id := range got {
		gotIDs = append(gotIDs, id)
	}
	sort.Strings(gotIDs)
	if strings.Join(gotIDs, ",") != strings.Join(wantIDs, ",") {
		t.Fatalf("webhook-ids %v, want the committed ones %v", gotIDs, wantIDs)
	}
	for _, tid := range threads {
		if byThread[tid] != 1 {
			t.Errorf("thread %s: %d deliveries", tid, byThread[tid])
		}
	}
}

// pendingEvents is /healthz's count of events waiting for delivery.
func pendingEvents(t *testing.T, base string) int {
	t.Helper()
	h := getHealth(t, base)
	ev, _ := h["events"].(map[string]any)
	n, _ := ev["pending"].(float64)
	return int(n)
}

func getHealth(t *testing.T, base string) map[string]any {
	t.Helper()
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}
