package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// dead-letters lists what the hook never accepted and retry puts it back in
// the queue; while another process holds the state file both commands fail
// with exit 1 and say to stop it.
func TestDeadLettersListAndRetry(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	t.Setenv("T3CODE_MCP_STATE_DIR", state)
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	ev := store.Event{ID: "ev1", Stream: "m/thread-1", Body: []byte(`{"id":"ev1"}`), CreatedAt: at}
	if err := st.Commit(store.Batch{Events: []store.Event{ev}}); err != nil {
		t.Fatal(err)
	}
	if errs, err := st.Record([]store.Op{{ID: "ev1", Kind: store.OpDead, At: at, Error: "receiver: HTTP 400\nbad"}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}

	for _, args := range [][]string{{"dead-letters"}, {"dead-letters", "retry"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), "stop the running t3code-mcp first") {
			t.Errorf("%v with the state held: exit %d, stderr %q", args, code, errb.String())
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	if code := run([]string{"dead-letters"}, &out, &errb); code != 0 {
		t.Fatalf("dead-letters: exit %d, stderr %q", code, errb.String())
	}
	want := "ev1\tm/thread-1\t2026-12-01T12:00:00Z\tattempts=1\treceiver: HTTP 400 bad\n1 dead letter\n"
	if out.String() != want {
		t.Errorf("dead-letters printed %q, want %q", out.String(), want)
	}

	out.Reset()
	if code := run([]string{"dead-letters", "retry", "ev1"}, &out, &errb); code != 0 || out.String() != "requeued 1 dead letter; the connector delivers them when it starts again\n" {
		t.Fatalf("retry: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"dead-letters"}, &out, &errb); code != 0 || out.String() != "0 dead letters\n" {
		t.Errorf("after retry: exit %d, stdout %q", code, out.String())
	}
	st, err = store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if p, err := st.Pending(0); err != nil || len(p) != 1 || p[0].ID != "ev1" {
		t.Errorf("pending after retry = %v, %v; want ev1", p, err)
	}
}
