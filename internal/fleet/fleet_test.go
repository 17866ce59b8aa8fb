package fleet_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// closedURL is an http URL on 127.0.0.1 where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

// A thread looked up while machines are out names each machine it could not
// search with its real state; a thread the state file places on a machine
// that is out says what is wrong there, naming the machine once. A token
// handed over directly is used instead of token_env.
func TestThreadLookupNamesEachMachinesState(t *testing.T) {
	refusing := t3fake.StartT(t, t3fake.Options{})
	refusing.SetUnauthorized(true)
	good := t3fake.StartT(t, t3fake.Options{})
	cfg := &config.Config{Machines: []config.Machine{
		{Name: "auth", URL: refusing.URL(), TokenEnv: "T3_FLEET_TEST_TOKEN", Projects: []string{"*"}},
		{Name: "gone", URL: closedURL(t), TokenEnv: "T3_FLEET_TEST_TOKEN", Projects: []string{"*"}},
		{Name: "good", URL: good.URL(), Projects: []string{"*"}},
		{Name: "notoken", URL: good.URL(), TokenEnv: "T3_FLEET_TEST_UNSET", Projects: []string{"*"}},
	}}
	t.Setenv("T3_FLEET_TEST_TOKEN", "tok")
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := fleet.New(cfg, st, fleet.Options{
		Logger: slog.New(slog.DiscardHandler), MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Tokens: map[string]string{"good": good.Token()},
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()

	status := func(name string) string {
		m, err := f.Machine(name)
		if err != nil {
			t.Fatal(err)
		}
		return m.Info().Status
	}
	deadline := time.Now().Add(30 * time.Second)
	for status("auth") != fleet.Unauthorized || status("good") != fleet.Online || status("gone") != fleet.Offline {
		if time.Now().After(deadline) {
			t.Fatalf("statuses: auth %s, good %s, gone %s", status("auth"), status("good"), status("gone"))
		}
		time.Sleep(5 * time.Millisecond)
	}

	_, err = f.Thread("thread-nowhere")
	want := `thread "thread-nowhere" not found on the reachable machines; not searched: auth (unauthorized), gone (offline), notoken (misconfigured) (see t3_machines)`
	if err == nil || err.Error() != want {
		t.Errorf("lookup error:\n got %v\nwant %s", err, want)
	}

	now := time.Now()
	if err := st.PutThread(store.Thread{ID: "thread-on-notoken", Machine: "notoken", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	_, err = f.Thread("thread-on-notoken")
	want = `thread "thread-on-notoken" cannot be read now: machine "notoken" is misconfigured: environment variable T3_FLEET_TEST_UNSET (token_env) is not set`
	if err == nil || err.Error() != want {
		t.Errorf("tracked lookup error:\n got %v\nwant %s", err, want)
	}
	if strings.Count(err.Error(), `"notoken"`) != 1 {
		t.Errorf("the machine is named more than once: %v", err)
	}
}

// countingProxy forwards TCP connections to target and counts them: how many
// connections a client opened to a machine.
type countingProxy struct {
	ln       net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

// TestReadsKeepTheirConnections: a machine's reads reuse kept-alive
// connections. Four reads at once, three times over, open four connections;
// with http.DefaultTransport's two idle connections per host (the clients'
// transport before the fleet had its own) every round after the first
// dialled two again, a fifth of a t3_wait result's read under load.
func TestReadsKeepTheirConnections(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{})
	tid := fk.AddThread(fk.AddProject("p", "/srv/p"), "t", "idle")
	proxy := newCountingProxy(t, strings.TrimPrefix(fk.URL(), "http://"))
	cfg := &config.Config{Machines: []config.Machine{{Name: "m", URL: "http://" + proxy.ln.Addr().String(), Projects: []string{"*"}}}}
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := fleet.New(cfg, st, fleet.Options{Logger: slog.New(slog.DiscardHandler), Tokens: map[string]string{"m": fk.Token()}})
	m, err := f.Machine("m")
	if err != nil {
		t.Fatal(err)
	}
	const route = "GET /api/orchestration/threads/{id}/bounded"
	const inFlight, rounds = 4, 3
	for round := 1; round <= rounds; round++ {
		fk.HangThreadReads(tid, true) // all inFlight reads are in the fake at once
		errs := make(chan error, inFlight)
		for range inFlight {
			go func() {
				_, err := m.RecentKeep(context.Background(), tid, t3.Keep{Runs: 1})
				errs <- err
			}()
		}
		deadline := time.Now().Add(30 * time.Second)
		for fk.Stats().HTTPRequests[route] < int64(round*inFlight) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d reads reached the machine", round, fk.Stats().HTTPRequests[route])
			}
			time.Sleep(time.Millisecond)
		}
		fk.HangThreadReads(tid, false)
		for range inFlight {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := proxy.accepted.Load(); n != inFlight {
		t.Errorf("%d rounds of %d reads at once opened %d connections, want %d", rounds, inFlight, n, inFlight)
	}
}
