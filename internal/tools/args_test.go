package tools

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
)

// A wrong argument is named with what it must be and what was sent, never
// with the decoder's byte offsets. The calls go through each tool's adapter
// (typed) with an empty Deps: the arguments are refused before the handler
// runs, so no handler decodes them itself.
func TestArgumentErrorsNameTheFieldTheTypeAndTheValue(t *testing.T) {
	cases := []struct {
		tool, raw, want string
		v               decoder
	}{
		{mcptools.ToolDispatch, `{"machine":"demo","project":"demo","prompt":1}`,
			`t3_dispatch: argument "prompt" must be a string; got the number 1 (see the tool's input schema)`, &mcptools.DispatchInput{}},
		{mcptools.ToolDispatch, `{"machine":"demo","project":"demo","prompt":"x","watch":"yes"}`,
			`t3_dispatch: argument "watch" must be true or false; got the string "yes" (see the tool's input schema)`, &mcptools.DispatchInput{}},
		{mcptools.ToolDispatch, `{"machine":"demo","project":"demo","prompt":"x","bogus":1}`,
			`t3_dispatch: unknown argument "bogus"; this tool takes: `, &mcptools.DispatchInput{}},
		{mcptools.ToolDispatch, `[1]`,
			`t3_dispatch: the arguments must be a JSON object; got an array (see the tool's input schema)`, &mcptools.DispatchInput{}},
		{mcptools.ToolWait, `{"thread_id":"t","timeout":"30"}`,
			`t3_wait: argument "timeout" must be a whole number; got the string "30" (see the tool's input schema)`, &mcptools.WaitInput{}},
		{mcptools.ToolWait, `{"thread_id":"t","timeout":1.5}`,
			`t3_wait: argument "timeout" must be a whole number; got the number 1.5 (see the tool's input schema)`, &mcptools.WaitInput{}},
		{mcptools.ToolProjects, `{}`,
			`t3_projects: missing argument "machine" (a string) (see the tool's input schema)`, &mcptools.ProjectsInput{}},
		{mcptools.ToolAnswer, `{"thread_id":"t","answers":{"q":5}}`,
			`t3_answer: argument "answers.q" must be a string or an array of strings; got the number 5 (see the tool's input schema)`, &mcptools.AnswerInput{}},
		{mcptools.ToolAnswer, `{"thread_id":"t","answers":"Workspace"}`,
			`t3_answer: argument "answers" must be an object; got the string "Workspace" (see the tool's input schema)`, &mcptools.AnswerInput{}},
	}
	for _, tc := range cases {
		err := decodeArgs(tc.tool, json.RawMessage(tc.raw), tc.v)
		if err == nil || len(err.Error()) < len(tc.want) || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("%s %s:\n got %v\nwant %s…", tc.tool, tc.raw, err, tc.want)
		}
		_, err = call(t, tc.tool, tc.raw)
		if err == nil || len(err.Error()) < len(tc.want) || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("%s %s through the tool's adapter:\n got %v\nwant %s…", tc.tool, tc.raw, err, tc.want)
		}
	}
}

// call runs a tool's handler as All builds it, with an empty Deps (default
// limits): what it can answer without a fleet.
func call(t *testing.T, tool, raw string) (Result, error) {
	t.Helper()
	for _, tl := range All() {
		if tl.Spec.Name == tool {
			return tl.Handler(&Deps{Limits: Limits{}.withDefaults()})(t.Context(), &Call{Args: json.RawMessage(raw)})
		}
	}
	t.Fatalf("no tool %s", tool)
	return Result{}, nil
}

// t3_answer's arguments are bounded before they are decoded.
func TestAnswerArgumentsOverTheLimitAreRefusedBeforeDecoding(t *testing.T) {
	raw := `{"thread_id":"t","answers":{"q":"` + strings.Repeat("x", 64<<10) + `"},"bogus":1}`
	_, err := call(t, mcptools.ToolAnswer, raw)
	if err == nil || !strings.Contains(err.Error(), "more than the limit of 65536 (T3CODE_MCP_MAX_ANSWER_BYTES)") {
		t.Fatalf("err = %v", err)
	}
}

// run_id only picks the run of a diff: alone it would be ignored without a word.
func TestThreadRunIDWithoutDiffIsRefused(t *testing.T) {
	_, err := call(t, mcptools.ToolThread, `{"thread_id":"t","run_id":"r"}`)
	if err == nil || !strings.Contains(err.Error(), "pass diff: true") {
		t.Fatalf("err = %v", err)
	}
}
