package t3fake

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// readRPCKinds collects, from one doc's frames, the key sets of the values
// and typed errors that the read RPCs of lists.go answered.
func readRPCKinds(t *testing.T, d doc, into map[string]map[string]bool) {
	t.Helper()
	add := func(kind string, v any) {
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		if into[kind] == nil {
			into[kind] = map[string]bool{}
		}
		for k := range m {
			into[kind][k] = true
		}
	}
	methods := map[string]string{}
	for _, f := range d.Frames {
		if f.Dir != "send" && f.Dir != "recv" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(f.Data), &m) != nil {
			continue // arrays of messages: none of these RPCs' exits come batched
		}
		if f.Dir == "send" {
			if m["_tag"] == "Request" {
				methods[fmt.Sprint(m["id"])] = m["tag"].(string)
			}
			continue
		}
		method := methods[fmt.Sprint(m["requestId"])]
		switch method {
		case "orchestration.getArchivedShellSnapshot", "orchestration.searchThreads", "orchestration.getTurnDiff", "orchestration.getFullThreadDiff":
		default:
			continue
		}
		if m["_tag"] != "Exit" {
			continue
		}
		ex, _ := m["exit"].(map[string]any)
		if v := ex["value"]; v != nil {
			add(method, v)
			vm, _ := v.(map[string]any)
			for _, x := range list(vm["matches"]) {
				add(method+".match", x)
			}
		}
		for _, c := range list(ex["cause"]) {
			cm, _ := c.(map[string]any)
			if e := cm["error"]; e != nil {
				add(method+".Err."+str(cm, "error", "_tag"), e)
			} else {
				add(method+".Cause."+fmt.Sprint(cm["_tag"]), cm)
			}
		}
	}
}

// The fake's answers to getArchivedShellSnapshot, searchThreads, getTurnDiff
// and getFullThreadDiff have the recorded keys (fixtures 22, 23), errors
// without T3's server-side cause chain (its text is folded into message), and
// the recorded limits: a range from turn 0 fails once a thread has two runs,
// the first run's changes do not show, a range past the last turn fails.
func TestReadRPCsMatchRecordings(t *testing.T) {
	recorded := map[string]map[string]bool{}
	for _, name := range []string{"22-ws-turn-diffs.json", "23-ws-thread-lists.json"} {
		b, err := os.ReadFile(filepath.Join(fixtureDir, "t3-v2-pr2829", name))
		if err != nil {
			t.Fatal(err)
		}
		var d doc
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		readRPCKinds(t, d, recorded)
	}

	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("fixtures", "/srv/workspace")
	rec := &recorder{}
	a := dial(t, s, s.Token(), rec)
	shell := a.subscribeReady("orchestration.subscribeShell", `{"requestCompletionMarker":true}`)
	a.call("orchestration.dispatchCommand", createThreadPayload("c-1", "t-diff", pid))
	for i, text := range []string{"Please remember zebracorn.", "Change more."} {
		a.call("orchestration.dispatchCommand", dispatchPayload(fmt.Sprintf("c-r%d", i), "t-diff", fmt.Sprintf("m-%d", i), text))
		for s.Pending() > 0 {
			s.StepAll()
		}
		a.waitItem(shell, 0, isShell("t-diff", "completed"))
	}
	a.call("orchestration.dispatchCommand", createThreadPayload("c-2", "t-archived", pid))
	if !s.ArchiveThread("t-archived") {
		t.Fatal("archive failed")
	}

	arch := asMap(t, a.success(a.call("orchestration.getArchivedShellSnapshot", `{}`)))
	if rows := list(arch["threads"]); len(rows) != 1 || str(rows[0].(map[string]any), "id") != "t-archived" {
		t.Fatalf("archived snapshot = %v", arch)
	}
	found := asMap(t, a.success(a.call("orchestration.searchThreads", `{"query":"zebracorn","limit":10}`)))
	if ms := list(found["matches"]); len(ms) != 1 || str(ms[0].(map[string]any), "threadId") != "t-diff" {
		t.Fatalf("search = %v", found)
	}
	a.call("orchestration.searchThreads", `{"query":"z"}`)
	a.call("orchestration.searchThreads", `{"query":"zebracorn","limit":0}`)
	diff := asMap(t, a.success(a.call("orchestration.getTurnDiff", `{"threadId":"t-diff","fromTurnCount":1,"toTurnCount":2}`)))
	if !strings.HasPrefix(str(diff, "diff"), "diff --git a/README.md b/README.md\n") {
		t.Fatalf("diff of run 2 = %v", diff)
	}
	if d := asMap(t, a.success(a.call("orchestration.getTurnDiff", `{"threadId":"t-diff","fromTurnCount":2,"toTurnCount":2}`))); str(d, "diff") != "" {
		t.Fatalf("empty range = %v", d)
	}
	for _, p := range []string{
		`{"threadId":"t-diff","fromTurnCount":0,"toTurnCount":1}`,
		`{"threadId":"t-diff","fromTurnCount":1,"toTurnCount":3}`,
		`{"threadId":"t-diff","fromTurnCount":2,"toTurnCount":1}`,
		`{"threadId":"thread-does-not-exist","fromTurnCount":0,"toTurnCount":1}`,
	} {
		if _, ok := a.call("orchestration.getTurnDiff", p).Exit.GetExitSuccess(); ok {
			t.Errorf("getTurnDiff %s succeeded", p)
		}
	}
	if _, ok := a.call("orchestration.getFullThreadDiff", `{"threadId":"t-diff","toTurnCount":2}`).Exit.GetExitSuccess(); ok {
		t.Error("a full-thread diff of a two-run thread succeeded")
	}
	a.success(a.call("orchestration.getFullThreadDiff", `{"threadId":"t-diff","toTurnCount":0}`))

	got := map[string]map[string]bool{}
	readRPCKinds(t, toDoc(rec), got)
	for kind, keys := range recorded {
		want := sortedSet(keys)
		if strings.Contains(kind, ".Err.") {
			want = sortedSet(without(keys, "cause"))
		}
		if !reflect.DeepEqual(sortedSet(got[kind]), want) {
			t.Errorf("%s: fake keys %v, recorded %v", kind, sortedSet(got[kind]), want)
		}
	}
	for kind := range got {
		if recorded[kind] == nil {
			t.Errorf("the fake sends %s, which the recordings do not show", kind)
		}
	}
}

func without(m map[string]bool, k string) map[string]bool {
	out := map[string]bool{}
	for x := range m {
		if x != k {
			out[x] = true
		}
	}
	return out
}
