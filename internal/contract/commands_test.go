package contract

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// encoder is what the generated command types offer for sending.
type encoder interface {
	decoder
	MarshalJSON() ([]byte, error)
}

// TestCommandShapes decodes every recorded thread.create, message.dispatch, run.interrupt,
// runtime-request.respond and launchThread payload into its generated type, encodes it again and
// compares the result with the recording: the same keys at every level (so a required field such
// as createdBy or creationSource cannot go missing) and the same values.
func TestCommandShapes(t *testing.T) {
	r := replayFrames(t, loadRecordings(t), counter{})
	want := map[string]int{
		"ThreadCreateCommand": 0, "MessageDispatchCommand": 0, "RunInterruptCommand": 0,
		"RuntimeRequestRespondCommand": 0, "LaunchThreadInput": 0,
	}
	for _, req := range r.requests {
		if _, ok := want[req.target]; !ok || req.decodeErr != nil {
			continue // payloads that do not decode are TestRecordedFramesDecode's business
		}
		_, target := payloadTarget(req.method, req.cmdType)
		enc, ok := target.(encoder)
		if !ok {
			t.Fatalf("%s cannot encode", req.target)
		}
		if err := decode(enc, req.payload); err != nil {
			t.Fatalf("%s: %v", req.where, err)
		}
		got, err := enc.MarshalJSON()
		if err != nil {
			t.Errorf("%s: encode %s: %v", req.where, req.target, err)
			continue
		}
		var recorded, encoded any
		if err := json.Unmarshal(req.payload, &recorded); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &encoded); err != nil {
			t.Errorf("%s: %s encodes invalid JSON: %v\n%s", req.where, req.target, err, got)
			continue
		}
		if diffs := keyDiff("", recorded, encoded); len(diffs) > 0 {
			t.Errorf("%s: %s does not reproduce the recorded keys:\n  %s\nrecorded: %s\nencoded:  %s",
				req.where, req.target, strings.Join(diffs, "\n  "), req.payload, got)
			continue
		}
		if !reflect.DeepEqual(recorded, encoded) {
			t.Errorf("%s: %s changes a value:\nrecorded: %s\nencoded:  %s", req.where, req.target, req.payload, got)
			continue
		}
		want[req.target]++
	}
	for name, n := range want {
		if n == 0 {
			t.Errorf("no recorded %s payload was compared", name)
		}
	}
	t.Logf("compared: %v", want)
	// A zero value encodes exactly its required fields: those a caller cannot leave out.
	for name, fields := range map[string][]string{
		"ThreadCreateCommand":    {"createdBy", "creationSource", "modelSelection", "runtimeMode", "interactionMode", "branch", "worktreePath"},
		"MessageDispatchCommand": {"createdBy", "creationSource", "messageId", "attachments", "dispatchMode"},
		"LaunchThreadInput":      {"creationSource", "threadId", "modelSelection", "workspaceStrategy"},
	} {
		_, target := payloadTarget(commandMethod(name))
		b, err := target.(encoder).MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(b, &keys); err != nil {
			t.Fatalf("%s zero value: %v\n%s", name, err, b)
		}
		for _, f := range fields {
			if _, ok := keys[f]; !ok {
				t.Errorf("%s does not require %s: T3 refuses the command without it", name, f)
			}
		}
	}
}

// keyDiff lists the object keys present on one side only, at every depth.
func keyDiff(path string, recorded, encoded any) []string {
	var out []string
	switch r := recorded.(type) {
	case map[string]any:
		e, ok := encoded.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: recorded an object, encoded %T", orRoot(path), encoded)}
		}
		keys := map[string]bool{}
		for k := range r {
			keys[k] = true
		}
		for k := range e {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			rv, inR := r[k]
			ev, inE := e[k]
			switch {
			case !inE:
				out = append(out, fmt.Sprintf("%s.%s: recorded, missing after encoding", path, k))
			case !inR:
				out = append(out, fmt.Sprintf("%s.%s: added by encoding, not in the recording", path, k))
			default:
				out = append(out, keyDiff(path+"."+k, rv, ev)...)
			}
		}
	case []any:
		e, ok := encoded.([]any)
		if !ok || len(e) != len(r) {
			return []string{fmt.Sprintf("%s: recorded %d items, encoded %v", orRoot(path), len(r), encoded)}
		}
		for i := range r {
			out = append(out, keyDiff(fmt.Sprintf("%s[%d]", path, i), r[i], e[i])...)
		}
	}
	return out
}

func orRoot(path string) string {
	if path == "" {
		return "(root)"
	}
	return path
}

// commandMethod returns the method and command type whose payload is the named type.
func commandMethod(name string) (method, cmdType string) {
	switch name {
	case "ThreadCreateCommand":
		return methodDispatch, "thread.create"
	case "MessageDispatchCommand":
		return methodDispatch, "message.dispatch"
	case "LaunchThreadInput":
		return methodLaunchThread, ""
	}
	panic("no command " + name)
}
