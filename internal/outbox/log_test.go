package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// logLines decodes a JSON log into its lines.
func logLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// runLogged delivers evs through an outbox logging at level into a buffer, with summaries every
// summary (an hour: only the one at shutdown), and returns the log once Run has returned.
func runLogged(t *testing.T, level slog.Level, summary time.Duration, evs ...store.Event) string {
	t.Helper()
	rc := newReceiver(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	logs := &syncBuffer{}
	ob, err := New(st, Config{URL: rc.srv.URL, Backoff: constBackoff(0),
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		t.Fatal(err)
	}
	ob.summaryEvery = summary
	if err := st.Commit(store.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ob.Run(ctx); close(done) }()
	eventually(t, "every event delivered", func() bool {
		_, _, dl, err := st.Counts()
		return err == nil && dl == len(evs)
	})
	cancel()
	<-done
	return logs.String()
}

// At Info an operator sees the deliveries summed up (how many, since when, the longest lag), not
// a line per event: that line is Debug (troubleshooting.md: "--log-level debug adds … each
// delivered event").
func TestDeliveriesSummedUpAtInfo(t *testing.T) {
	evs := []store.Event{mkEvent("m/a", 1), mkEvent("m/a", 2), mkEvent("m/b", 1)}
	lines := logLines(t, runLogged(t, slog.LevelInfo, time.Hour, evs...))
	summed := 0
	for _, l := range lines {
		switch l["msg"] {
		case "event delivered":
			t.Errorf("a per-event line at Info: %v", l)
		case "outbox: events delivered":
			summed += int(l["count"].(float64))
			if _, ok := l["max_lag_ms"]; !ok {
				t.Errorf("summary without max_lag_ms: %v", l)
			}
			if _, err := time.Parse(time.RFC3339, l["since"].(string)); err != nil {
				t.Errorf("summary's since: %v", err)
			}
		}
	}
	if summed != len(evs) {
		t.Fatalf("summaries count %d deliveries, want %d; log:\n%v", summed, len(evs), lines)
	}
}

// At Debug every delivered event has its line, with what traces it: its id (the webhook-id), its
// stream and the attempt; and the summaries (here one per turn) add up to the deliveries.
func TestDeliveredEventLoggedAtDebug(t *testing.T) {
	evs := []store.Event{mkEvent("m/a", 1), mkEvent("m/b", 1)}
	lines := logLines(t, runLogged(t, slog.LevelDebug, 0, evs...))
	seen := map[string]bool{}
	summed := 0
	for _, l := range lines {
		switch l["msg"] {
		case "event delivered":
			if l["level"] != "DEBUG" || l["stream"] == nil || l["attempt"] != float64(1) || l["status"] != float64(204) {
				t.Errorf("line %v", l)
			}
			seen[l["id"].(string)] = true
		case "outbox: events delivered":
			summed += int(l["count"].(float64))
		}
	}
	for _, e := range evs {
		if !seen[e.ID] {
			t.Errorf("no line for %s", e.ID)
		}
	}
	if summed != len(evs) {
		t.Errorf("summaries count %d deliveries, want %d", summed, len(evs))
	}
}
