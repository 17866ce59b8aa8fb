package threadstate

import (
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// row builds a shell row; "" for a pointer means null, "-" means the field is absent.
func row(status, active, latest string) *t3rpc.ThreadShell {
	t := &t3rpc.ThreadShell{ID: "t", Status: status}
	ptr := func(v string) t3rpc.OptNilString {
		switch v {
		case "-":
			return t3rpc.OptNilString{}
		case "":
			var o t3rpc.OptNilString
			o.SetToNull()
			return o
		}
		return t3rpc.NewOptNilString(v)
	}
	t.ActiveRunId, t.LatestRunId = ptr(active), ptr(latest)
	return t
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		status, active, latest string
		run                    string
		want                   Verdict
		out                    Outcome
	}{
		{"running latest", "running", "r1", "r1", "r1", RunBusy, ""},
		{"finished run keeps its status", "completed", "", "r1", "r1", RunSettled, Completed},
		{"failed", "failed", "", "r1", "r1", RunSettled, Failed},
		// Fixture 21: run 1 runs, run 2 queued: status follows run 2.
		{"queued follow-up: the active run", "queued", "r1", "r2", "r1", RunBusy, ""},
		{"queued follow-up: the queued run", "queued", "r1", "r2", "r2", RunBusy, ""},
		// Fixture 21: the newest queued run cancelled while run 2 runs.
		{"newest queued cancelled, older runs on", "cancelled", "r2", "r4", "r4", RunSettled, Interrupted},
		{"the older run is still busy", "cancelled", "r2", "r4", "r2", RunBusy, ""},
		{"a run between active and latest", "cancelled", "r2", "r4", "r3", RunUnknown, ""},
		{"an older run", "completed", "", "r2", "r1", RunUnknown, ""},
		// A server that reports idle after a finished run.
		{"idle after a run", "idle", "", "r1", "r1", RunSettledUnreadable, ""},
		{"status and pointers disagree", "running", "", "r1", "r1", RunBusy, ""},
		{"unknown status, nothing active", "paused", "", "r1", "r1", RunSettledUnreadable, ""},
		{"unknown status, something active", "paused", "r0", "r1", "r1", RunBusy, ""},
		{"no pointers at all: status decides", "completed", "-", "r1", "r1", RunSettled, Completed},
		{"no pointers, idle", "idle", "-", "r1", "r1", RunSettledUnreadable, ""},
		{"no pointers, busy", "waiting", "-", "r1", "r1", RunBusy, ""},
		{"no run asked", "completed", "", "r1", "", RunUnknown, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, v := Judge(row(tc.status, tc.active, tc.latest), tc.run)
			if v != tc.want || out != tc.out {
				t.Fatalf("Judge = %s %q, want %s %q", v, out, tc.want, tc.out)
			}
		})
	}
}

func TestBusy(t *testing.T) {
	for _, tc := range []struct {
		status, active, latest string
		want                   bool
	}{
		{"queued", "r1", "r2", true},
		{"cancelled", "r2", "r4", true},   // status says cancelled, run 2 still runs
		{"completed", "", "r1", false},    // settled
		{"idle", "", "", false},           // never ran
		{"queued", "", "r3", true},        // between runs: the queued one has not started
		{"running", "-", "r1", true},      // no pointers: status decides
		{"interrupted", "-", "r1", false}, // no pointers: status decides
	} {
		if got := Busy(row(tc.status, tc.active, tc.latest)); got != tc.want {
			t.Errorf("Busy(%s, active %q, latest %q) = %v, want %v", tc.status, tc.active, tc.latest, got, tc.want)
		}
	}
}
