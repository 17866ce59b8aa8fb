package app_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// t3_thread with diff: a run's files and unified diff through getTurnDiff,
// cut to the limit with a marker and the total size; the first run, which T3
// cannot diff, is said so plainly with the checkpoint's files.
func TestThreadDiff(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: time.Millisecond})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	c := h.client("")
	run := func(tid, prompt string) string {
		t.Helper()
		args := map[string]any{"machine": "mac", "project": "api", "prompt": prompt}
		if tid != "" {
			args["thread_id"] = tid
		}
		tid = str(c.ok("t3_dispatch", args), "thread_id")
		if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "completed" {
			t.Fatalf("wait = %v", w)
		}
		return tid
	}
	diffOf := func(args map[string]any) (map[string]any, string) {
		t.Helper()
		args["diff"] = true
		sc, text, isErr := c.call("t3_thread", args)
		if isErr {
			t.Fatalf("t3_thread(%v): %s", args, text)
		}
		return sc["diff"].(map[string]any), text
	}

	tid := run("", "first change")
	d, text := diffOf(map[string]any{"thread_id": tid})
	files := d["files"].([]any)
	if !strings.Contains(str(d, "unavailable"), "first run") || len(files) != 1 || files[0].(map[string]any)["path"] != "README.md" || !strings.Contains(text, "no diff of run") {
		t.Fatalf("first run's diff = %v\n%s", d, text)
	}

	run(tid, "second change")
	d, text = diffOf(map[string]any{"thread_id": tid})
	run2 := str(d, "run_id")
	diff := str(d, "diff")
	if d["unavailable"] != nil || !strings.HasPrefix(diff, "diff --git a/README.md b/README.md\n") || d["total_bytes"] != float64(len(diff)) || !strings.Contains(text, diff) {
		t.Fatalf("second run's diff = %v", d)
	}
	f := d["files"].([]any)[0].(map[string]any)
	if f["path"] != "README.md" || f["additions"] != float64(strings.Count(diff, "\n+")-1) {
		t.Fatalf("files = %v", d["files"])
	}

	fk.SetDiffLines(5000)
	run(tid, "a big change")
	d, _ = diffOf(map[string]any{"thread_id": tid})
	diff, total := str(d, "diff"), int(d["total_bytes"].(float64))
	if total <= len(diff) || len(diff) > 25<<10 || !strings.HasSuffix(diff, "… [diff cut: "+strconv.Itoa(len(diff)-len(cutMarker(diff)))+" of "+strconv.Itoa(total)+" bytes shown]\n") {
		t.Fatalf("big diff: %d bytes shown of %d, ends %q", len(diff), total, diff[max(0, len(diff)-80):])
	}
	// An earlier run by its id.
	fk.SetDiffLines(0)
	if d, _ := diffOf(map[string]any{"thread_id": tid, "run_id": run2}); str(d, "run_id") != run2 || d["total_bytes"].(float64) > 1000 {
		t.Fatalf("run 2 by id = %v", d)
	}
	c.fails("t3_thread", map[string]any{"thread_id": tid, "diff": true, "run_id": "run-nope"}, `has no run "run-nope"`)
}

func cutMarker(diff string) string {
	i := strings.LastIndex(diff, "… [diff cut:")
	return diff[i:]
}
