package tools

import (
	"encoding/json"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
)

func TestCallFingerprintTellsCallsApart(t *testing.T) {
	base := mcptools.DispatchInput{Machine: mcptools.NewOptString("mac"), Project: mcptools.NewOptString("api"), Prompt: "fix it"}
	variants := []func(*mcptools.DispatchInput){
		func(in *mcptools.DispatchInput) { in.Prompt = "fix it now" },
		func(in *mcptools.DispatchInput) { in.Project = mcptools.NewOptString("web") },
		func(in *mcptools.DispatchInput) {
			in.Mode = mcptools.NewOptDispatchInputMode(mcptools.DispatchInputModeSteer)
		},
		func(in *mcptools.DispatchInput) {
			in.Worktree = mcptools.NewOptWorktreeSpec(mcptools.WorktreeSpec{BaseRef: mcptools.NewOptString("main")})
		},
		// The same bytes split differently between two fields.
		func(in *mcptools.DispatchInput) {
			in.Machine, in.Project = mcptools.NewOptString("maca"), mcptools.NewOptString("pi")
		},
	}
	seen := map[string]int{callFingerprint(base): -1}
	for i, v := range variants {
		in := base
		v(&in)
		fp := callFingerprint(in)
		if j, dup := seen[fp]; dup {
			t.Fatalf("variant %d has the fingerprint of %d", i, j)
		}
		seen[fp] = i
	}
	same := base
	same.Watch = mcptools.NewOptBool(false) // watch changes no command
	if callFingerprint(same) != callFingerprint(base) {
		t.Fatal("watch changed the fingerprint")
	}
}

func TestRekeyedStepKeepsTheCommand(t *testing.T) {
	st, err := commandStep(t3.MessageDispatchMode("thread-1", "msg-1", "go on", "", t3rpc.DispatchMode{Type: t3rpc.DispatchModeTypeQueueAfterActive}))
	if err != nil {
		t.Fatal(err)
	}
	re, err := st.rekeyed()
	if err != nil {
		t.Fatal(err)
	}
	if re.ID == st.ID || re.Type != st.Type {
		t.Fatalf("rekeyed = %+v from %+v", re, st)
	}
	var before, after map[string]any
	_ = json.Unmarshal(st.Body, &before)
	_ = json.Unmarshal(re.Body, &after)
	if after["commandId"] != re.ID {
		t.Fatalf("body commandId = %v, want %s", after["commandId"], re.ID)
	}
	delete(before, "commandId")
	delete(after, "commandId")
	b1, _ := json.Marshal(before)
	b2, _ := json.Marshal(after)
	if string(b1) != string(b2) {
		t.Fatalf("the command changed beyond its id:\n%s\n%s", b1, b2)
	}
}
