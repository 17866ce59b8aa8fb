package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The recorder, pointed at a server speaking the real protocol (the fake),
// writes fixture-format recordings with the token and tickets redacted.
func TestRecordScenariosRedacted(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{Token: "live-token-5d1c9a", StepDelay: 20 * time.Millisecond})
	fk.AddProject("api", "/srv/api")
	for _, sc := range []string{"reads", "basic", "interrupt"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := runScenario(ctx, sc, fk.URL(), fk.Token(), "api")
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", sc, err)
		}
		b, err := json.Marshal(r.rec)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "live-token-5d1c9a") {
			t.Fatalf("%s: token in the recording", sc)
		}
		if len(r.rec.Exchanges) == 0 {
			t.Fatalf("%s: no exchanges", sc)
		}
		if sc == "reads" {
			continue
		}
		var sent, recv int
		for _, f := range r.rec.Frames {
			switch f.Dir {
			case "send":
				sent++
			case "recv":
				recv++
			}
			if strings.Contains(f.Data, "wsTicket") {
				t.Fatalf("%s: ticket in a frame", sc)
			}
		}
		if sent == 0 || recv == 0 {
			t.Fatalf("%s: frames sent %d, received %d", sc, sent, recv)
		}
		for _, e := range r.rec.Exchanges {
			if strings.Contains(e.URL, "/api/auth/websocket-ticket") && !strings.Contains(e.ResponseBody, `"ticket":"REDACTED"`) {
				t.Fatalf("%s: ticket not redacted: %s", sc, e.ResponseBody)
			}
			if a := e.RequestHeaders["authorization"]; a != "" && a != "Bearer REDACTED" {
				t.Fatalf("%s: authorization header kept: %q", sc, a)
			}
		}
	}
}
