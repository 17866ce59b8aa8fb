package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// buildBinary builds cmd/t3code-mcp into the test's temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "t3code-mcp")
	build := exec.Command("go", "build", "-o", bin, "github.com/t3code-mcp/t3code-mcp/cmd/t3code-mcp")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// countingReceiver is the one webhook receiver of all replicas. It records every delivery's
// webhook-id per transition, and how many deliveries of the same event were in flight at once
// (each is held a few milliseconds, so two replicas sending one event together would overlap).
type countingReceiver struct {
	srv *httptest.Server

	mu          sync.Mutex
	ids         map[transition]map[string]bool // a transition → the webhook ids it arrived under
	inFlight    map[string]int                 // webhook id → deliveries in progress
	maxInFlight int
	deliveries  int
}

type transition struct{ thread, typ, run string }

func newCountingReceiver(t *testing.T) *countingReceiver {
	r := &countingReceiver{ids: map[transition]map[string]bool{}, inFlight: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var ev map[string]any
		_ = json.Unmarshal(b, &ev)
		id := req.Header.Get("webhook-id")
		k := transition{str(ev, "thread_id"), str(ev, "type"), str(ev, "run_id")}
		r.mu.Lock()
		r.deliveries++
		r.inFlight[id]++
		r.maxInFlight = max(r.maxInFlight, r.inFlight[id])
		if r.ids[k] == nil {
			r.ids[k] = map[string]bool{}
		}
		r.ids[k][id] = true
		r.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		r.mu.Lock()
		r.inFlight[id]--
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// missing lists the threads whose expected event type has not arrived.
func (r *countingReceiver) missing(want map[string]string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return missingTransitions(r.ids, want)
}

// missingTransitions lists the threads of want whose expected event type is not among got's keys.
func missingTransitions[V any](got map[transition]V, want map[string]string) []string {
	var out []string
	for tid, typ := range want {
		found := false
		for k := range got {
			found = found || (k.thread == tid && k.typ == typ)
		}
		if !found {
			out = append(out, tid)
		}
	}
	return out
}

// check fails the test for a transition that arrived under two webhook ids, or an event delivered
// twice at the same time.
func (r *countingReceiver) check(t *testing.T, want map[string]string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	perThread := map[string]int{}
	for k, ids := range r.ids {
		if len(ids) != 1 {
			t.Errorf("transition %+v arrived under %d webhook ids (duplicates must keep the id)", k, len(ids))
		}
		perThread[k.thread]++
	}
	for tid := range want {
		if perThread[tid] != 1 {
			t.Errorf("thread %s: %d distinct events, want 1", tid, perThread[tid])
		}
	}
	if r.maxInFlight > 1 {
		t.Errorf("one event was being delivered by %d replicas at once", r.maxInFlight)
	}
	t.Logf("%d deliveries of %d transitions", r.deliveries, len(r.ids))
}

// testLeaseTTL is 3s, short to keep the test short (the failover bound scales with it: TTL +
// TTL/3), unless T3CODE_MCP_LEASE_TTL is set (docs/benchmarks.md measures the default 6s so).
func testLeaseTTL() string {
	if v := os.Getenv("T3CODE_MCP_LEASE_TTL"); v != "" {
		return v
	}
	return "3s"
}

// replicaSet runs replicas of the built binary against one database and one fake T3 machine.
type replicaSet struct {
	t    *testing.T
	bin  string
	env  []string
	dir  string
	mu   sync.Mutex
	live map[string]*exec.Cmd // base URL → process
	n    int
}

func newReplicaSet(t *testing.T, bin, databaseURL string, fk *t3fake.Server, hook string) *replicaSet {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "t3code.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = \"T3CODE_MCP_REPLICA_TOKEN\"\n", fk.URL())), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := &replicaSet{t: t, bin: bin, dir: dir, live: map[string]*exec.Cmd{}, env: append(os.Environ(),
		"T3CODE_MCP_CONFIG="+cfg, "T3CODE_MCP_DATABASE_URL="+databaseURL, "T3CODE_MCP_HOOK_URL="+hook,
		"T3CODE_MCP_REPLICA_TOKEN="+fk.Token(), "T3CODE_MCP_LOG_LEVEL=warn",
		"T3CODE_MCP_LEASE_TTL="+testLeaseTTL())}
	t.Cleanup(func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		for _, cmd := range rs.live {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		}
		if t.Failed() {
			// What the replicas said (warnings and errors) is the first thing to read.
			logs, _ := filepath.Glob(filepath.Join(dir, "replica*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", filepath.Base(l), b[max(0, len(b)-4000):])
			}
		}
	})
	return rs
}

// start runs one more replica and waits until it serves.
func (rs *replicaSet) start() string {
	rs.t.Helper()
	return rs.startWith()
}

// startWith runs one more replica with extra environment (KEY=VALUE) and waits until it serves.
func (rs *replicaSet) startWith(extra ...string) string {
	rs.t.Helper()
	rs.mu.Lock()
	rs.n++
	n := rs.n
	rs.mu.Unlock()
	port := freePort(rs.t)
	cmd := exec.Command(rs.bin, "serve")
	cmd.Env = append(slices.Clone(rs.env), fmt.Sprintf("T3CODE_MCP_PORT=%d", port),
		"T3CODE_MCP_STATE_DIR="+filepath.Join(rs.dir, fmt.Sprintf("replica%d", n)))
	cmd.Env = append(cmd.Env, extra...)
	logf, err := os.Create(filepath.Join(rs.dir, fmt.Sprintf("replica%d.log", n)))
	if err != nil {
		rs.t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		rs.t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	rs.mu.Lock()
	rs.live[base] = cmd
	rs.mu.Unlock()
	waitReady(rs.t, base)
	return base
}

// kill ends a replica with SIGKILL: no lease released, no claim given back.
func (rs *replicaSet) kill(base string) { _ = rs.signal(base, syscall.SIGKILL) }

// stop ends a replica with SIGTERM and waits for it to exit: leases and claims released.
func (rs *replicaSet) stop(base string) {
	if err := rs.signal(base, syscall.SIGTERM); err != nil {
		rs.t.Errorf("replica %s after SIGTERM: %v", base, err)
	}
}

// signal sends sig to a replica and waits for it to exit.
func (rs *replicaSet) signal(base string, sig syscall.Signal) error {
	rs.mu.Lock()
	cmd := rs.live[base]
	delete(rs.live, base)
	rs.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	return cmd.Wait()
}

func (rs *replicaSet) bases() []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []string
	for b := range rs.live {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// holder is the live replica whose /healthz says it holds machine mac's lease ("" when none does).
func (rs *replicaSet) holder() string {
	var found []string
	for _, base := range rs.bases() {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			continue
		}
		var h struct {
			Replica struct{ Leases []string } `json:"replica"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if slices.Contains(h.Replica.Leases, "mac") {
			found = append(found, base)
		}
	}
	if len(found) > 1 {
		rs.t.Errorf("machine mac's lease is held by %d replicas at once: %v", len(found), found)
	}
	if len(found) == 0 {
		return ""
	}
	return found[0]
}

// awaitHolder waits for a holder other than not; the test's deadline bounds it.
func (rs *replicaSet) awaitHolder(not string) string {
	for {
		if h := rs.holder(); h != "" && h != not {
			return h
		}
		if dl, ok := rs.t.Deadline(); ok && time.Until(dl) < 10*time.Second {
			rs.t.Fatal("no replica took machine mac's lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitDelivered waits until every expected event has arrived.
func awaitDelivered(t *testing.T, rec interface {
	missing(map[string]string) []string
}, want map[string]string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		missing := rec.missing(want)
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events never arrived (threads %v)", len(missing), len(want), missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startThreeReplicas builds the binary and runs three replicas on the database, with one fake T3
// machine (mac, project api) and one receiver.
func startThreeReplicas(t *testing.T, databaseURL string) (*replicaSet, *countingReceiver) {
	t.Helper()
	bin := buildBinary(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: 8 * time.Millisecond})
	fk.AddProject("api", "/srv/api")
	rec := newCountingReceiver(t)
	rs := newReplicaSet(t, bin, databaseURL, fk, rec.srv.URL)
	for range 3 {
		rs.start()
	}
	return rs, rec
}

// dispatchSome starts n runs through the replica at base; each completes or fails after a few
// steps. It records what event each thread must produce.
func dispatchSome(t *testing.T, c *mcp.ClientSession, rng *rand.Rand, n int, want map[string]string) {
	t.Helper()
	for range n {
		prompt, typ := "finish the job", "thread.completed"
		if rng.IntN(3) == 0 {
			prompt, typ = "fail the job", "thread.failed"
		}
		res := callTool(t, c, "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": prompt})
		want[str(res, "thread_id")] = typ
		time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond)
	}
}

// TestReplicasFailoverOnSIGKILLLosesNoEvent: three replicas of the built binary share one
// PostgreSQL database, one fake T3 machine and one receiver. While runs settle, the replica holding
// the machine's lease is killed with SIGKILL at a random moment, several times (a fresh replica
// replaces it each time). Another replica takes the lease each time (the failover time is logged),
// every run's event reaches the receiver, a repeat carries the same webhook-id, and no event is
// ever being delivered by two replicas at once.
func TestReplicasFailoverOnSIGKILLLosesNoEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs three replicas")
	}
	rs, rec := startThreeReplicas(t, pgtest.New(t))
	want := map[string]string{}
	rng := rand.New(rand.NewPCG(16, 2))
	var failovers []time.Duration
	for round := range 3 {
		holder := rs.awaitHolder("")
		// Dispatch through a replica that will survive the round, so every accepted run is known.
		var via string
		for _, b := range rs.bases() {
			if b != holder {
				via = b
				break
			}
		}
		c := dial(t, via)
		dispatchSome(t, c, rng, 6, want)
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
		rs.kill(holder)
		killed := time.Now()
		next := rs.awaitHolder(holder)
		failovers = append(failovers, time.Since(killed))
		t.Logf("round %d: holder %s killed, %s took machine mac after %s", round, holder, next, failovers[round].Round(time.Millisecond))
		dispatchSome(t, c, rng, 3, want)
		c.Close()
		rs.start()
	}
	awaitDelivered(t, rec, want, 90*time.Second)
	rec.check(t, want)
	t.Logf("failover times after SIGKILL (lease TTL %s): %v", testLeaseTTL(), failovers)
}

// TestReplicasSurviveADatabaseRestart: with three replicas on a PostgreSQL server of the test's
// own, the server is restarted while runs settle; the replicas reconnect by themselves, and every
// run dispatched (before, during and after) has its event delivered once.
func TestReplicasSurviveADatabaseRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs three replicas")
	}
	srv := pgtest.StartServer(t)
	rs, rec := startThreeReplicas(t, srv.URL)
	rs.awaitHolder("")
	c := dial(t, rs.bases()[0])
	defer c.Close()
	want := map[string]string{}
	rng := rand.New(rand.NewPCG(16, 5))
	dispatchSome(t, c, rng, 6, want)
	srv.Restart(t)
	// Dispatches may fail while the database is away (the tool says so); runs accepted count.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for accepted := 0; accepted < 6; {
		res, err := c.CallTool(ctx, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		b, _ := json.Marshal(res.StructuredContent)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		want[str(m, "thread_id")] = "thread.completed"
		accepted++
	}
	rs.awaitHolder("")
	awaitDelivered(t, rec, want, 90*time.Second)
	rec.check(t, want)
}
