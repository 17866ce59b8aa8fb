package fleet_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
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
