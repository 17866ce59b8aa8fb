package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/audit"
)

// `t3code-mcp audit` reads the state directory's log, rotated files
// included, and filters by machine, thread and time.
func TestAuditCommandFilters(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("T3CODE_MCP_STATE_DIR", dir)
	l, err := audit.Open(dir, audit.Options{MaxBytes: 600, Keep: 5})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	recs := []audit.Record{
		{Time: now.Add(-3 * time.Hour), Tool: "t3_dispatch", Machine: "mac", Thread: "th-old", Approval: audit.Accepted, Result: audit.ResultOK},
		{Time: now.Add(-90 * time.Minute), Tool: "t3_interrupt", Machine: "pc", Thread: "th-pc", Approval: audit.NotRequired, Result: audit.ResultOK},
		{Time: now.Add(-30 * time.Minute), Tool: "t3_answer", Machine: "mac", Thread: "th-new", Approval: audit.Declined, Result: audit.ResultError, Error: "declined"},
		{Time: now.Add(-time.Minute), Tool: "t3_dispatch", Machine: "mac", Thread: "th-new", Approval: audit.Cancelled, Result: audit.ResultError, Error: "cancelled"},
	}
	for _, r := range recs {
		if err := l.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if files, _ := audit.Files(dir); len(files) < 2 {
		t.Fatalf("want the records spread over rotated files, got %v", files)
	}

	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := run(append([]string{"audit"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	threadsOf := func(jsonLines string) string {
		var ids []string
		for _, line := range strings.Split(strings.TrimSpace(jsonLines), "\n") {
			if line == "" {
				continue
			}
			var r audit.Record
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("not a JSON line: %q", line)
			}
			ids = append(ids, r.Tool+"@"+r.Thread)
		}
		return strings.Join(ids, " ")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "t3_dispatch@th-old t3_interrupt@th-pc t3_answer@th-new t3_dispatch@th-new"},
		{[]string{"--machine", "mac"}, "t3_dispatch@th-old t3_answer@th-new t3_dispatch@th-new"},
		{[]string{"--thread", "th-new"}, "t3_answer@th-new t3_dispatch@th-new"},
		{[]string{"--since", "2h"}, "t3_interrupt@th-pc t3_answer@th-new t3_dispatch@th-new"},
		{[]string{"--since", now.Add(-45 * time.Minute).UTC().Format(time.RFC3339)}, "t3_answer@th-new t3_dispatch@th-new"},
		{[]string{"--machine", "pc", "--since", "1h"}, ""},
	} {
		out, errOut, code := run(append(tc.args, "--json")...)
		if code != 0 || errOut != "" {
			t.Fatalf("%v: exit %d, stderr %q", tc.args, code, errOut)
		}
		if got := threadsOf(out); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
		}
	}

	out, errOut, code := run("--machine", "mac", "--thread", "th-new")
	if code != 0 || !strings.Contains(errOut, fmt.Sprintf("2 audit records from %s", dir)) {
		t.Fatalf("table: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[1], "declined") || !strings.Contains(lines[2], "cancelled") {
		t.Fatalf("table:\n%s", out)
	}

	for _, bad := range [][]string{{"--since", "yesterday"}, {"--bogus"}, {"extra"}} {
		if _, errOut, code := run(bad...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q", bad, code, errOut)
		}
	}
}
