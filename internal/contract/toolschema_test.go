package contract

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
)

var update = flag.Bool("update", false, "rewrite the golden tool schemas under testdata/toolschemas")

const goldenDir = "testdata/toolschemas"

// toolArgs is the contract of every tool's arguments: names, and which are required.
var toolArgs = map[string]struct{ all, required []string }{
	mcptools.ToolMachines:  {nil, nil},
	mcptools.ToolProjects:  {[]string{"machine"}, []string{"machine"}},
	mcptools.ToolDispatch:  {[]string{"machine", "project", "prompt", "title", "model", "thread_id", "mode", "worktree", "idempotency_key", "watch"}, []string{"prompt"}},
	mcptools.ToolThread:    {[]string{"thread_id", "turns", "diff", "run_id"}, []string{"thread_id"}},
	mcptools.ToolThreads:   {[]string{"machine", "project", "status", "query", "archived", "limit", "cursor"}, []string{"machine"}},
	mcptools.ToolWait:      {[]string{"thread_id", "thread_ids", "timeout"}, nil},
	mcptools.ToolAnswer:    {[]string{"thread_id", "answers", "decision"}, []string{"thread_id"}},
	mcptools.ToolInterrupt: {[]string{"thread_id"}, []string{"thread_id"}},
	mcptools.ToolWatch:     {[]string{"thread_id", "enabled"}, nil},
}

// toolGoTypes maps each tool to new values of the generated Go types of its input and output.
var toolGoTypes = map[string][2]func() encoder{
	mcptools.ToolMachines: {func() encoder { return new(mcptools.MachinesInput) }, func() encoder { return new(mcptools.MachinesOutput) }},
	mcptools.ToolProjects: {func() encoder { return new(mcptools.ProjectsInput) }, func() encoder { return new(mcptools.ProjectsOutput) }},
	mcptools.ToolDispatch: {func() encoder { return new(mcptools.DispatchInput) }, func() encoder { return new(mcptools.DispatchOutput) }},
	mcptools.ToolThread:   {func() encoder { return new(mcptools.ThreadInput) }, func() encoder { return new(mcptools.ThreadState) }},
	mcptools.ToolWait:     {func() encoder { return new(mcptools.WaitInput) }, func() encoder { return new(mcptools.WaitOutput) }},
	mcptools.ToolAnswer:   {func() encoder { return new(mcptools.AnswerInput) }, func() encoder { return new(mcptools.ThreadState) }},
	mcptools.ToolInterrupt: {func() encoder { return new(mcptools.InterruptInput) }, func() encoder {
		return new(mcptools.InterruptOutput)
	}},
	mcptools.ToolWatch:   {func() encoder { return new(mcptools.WatchInput) }, func() encoder { return new(mcptools.WatchOutput) }},
	mcptools.ToolThreads: {func() encoder { return new(mcptools.ThreadsInput) }, func() encoder { return new(mcptools.ThreadsOutput) }},
}

// TestToolSchemasGolden compares every tool's input and output schema, and its name, title,
// description and hints, with the golden files: a schema cannot change unnoticed. After a deliberate
// change: go test ./internal/contract/ -run TestToolSchemasGolden -update, and review the diff.
func TestToolSchemasGolden(t *testing.T) {
	want := map[string][]byte{}
	type entry struct {
		Name        string `json:"name"`
		Title       string `json:"title"`
		Description string `json:"description"`
		ReadOnly    bool   `json:"readOnly"`
		Destructive bool   `json:"destructive"`
		Idempotent  bool   `json:"idempotent"`
	}
	var index []entry
	for _, tool := range mcptools.Tools {
		want[tool.Name+".input.json"] = indentJSON(t, tool.InputSchema)
		want[tool.Name+".output.json"] = indentJSON(t, tool.OutputSchema)
		index = append(index, entry{tool.Name, tool.Title, tool.Description, tool.ReadOnly, tool.Destructive, tool.Idempotent})
	}
	b, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want["tools.json"] = append(b, '\n')

	existing, err := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range existing {
			if _, ok := want[filepath.Base(f)]; !ok {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
		}
		for name, data := range want {
			if err := os.WriteFile(filepath.Join(goldenDir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("wrote %d golden files to %s", len(want), goldenDir)
		return
	}
	for _, f := range existing {
		if _, ok := want[filepath.Base(f)]; !ok {
			t.Errorf("%s: golden file of no tool (run with -update to remove it)", f)
		}
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		got, err := os.ReadFile(filepath.Join(goldenDir, name))
		if err != nil {
			t.Errorf("%v (run with -update to create it)", err)
			continue
		}
		if !bytes.Equal(got, want[name]) {
			t.Errorf("%s: the generated schema differs from the golden file. If the change is deliberate, run\n"+
				"  go test ./internal/contract/ -run TestToolSchemasGolden -update\nand review the diff. First difference: %s",
				filepath.Join(goldenDir, name), firstDiff(got, want[name]))
		}
	}
}

// TestToolSchemasSelfContained checks what an MCP client needs from each schema: valid JSON,
// "type": "object" at the top, no $schema (MCP's default dialect, draft 2020-12, applies), no $ref
// left, every required property declared and every argument described for the agent. Output
// properties are described where their name and type do not say enough: tools/list is in every
// agent's context (internal/server's TestToolsListSize holds its size).
func TestToolSchemasSelfContained(t *testing.T) {
	if len(mcptools.Tools) != len(toolArgs) {
		t.Errorf("%d tools declared, the contract has %d", len(mcptools.Tools), len(toolArgs))
	}
	for _, tool := range mcptools.Tools {
		if _, ok := toolArgs[tool.Name]; !ok {
			t.Errorf("unexpected tool %s", tool.Name)
		}
		if !bytes.Equal(mcptools.InputSchemas[tool.Name], tool.InputSchema) || !bytes.Equal(mcptools.OutputSchemas[tool.Name], tool.OutputSchema) {
			t.Errorf("%s: InputSchemas/OutputSchemas disagree with Tools", tool.Name)
		}
		if strings.TrimSpace(tool.Description) == "" || strings.TrimSpace(tool.Title) == "" {
			t.Errorf("%s: no title or description", tool.Name)
		}
		for kind, raw := range map[string]json.RawMessage{"input": tool.InputSchema, "output": tool.OutputSchema} {
			var s map[string]any
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Errorf("%s %s schema: %v", tool.Name, kind, err)
				continue
			}
			if s["type"] != "object" {
				t.Errorf("%s %s schema: top-level type is %v, MCP needs object", tool.Name, kind, s["type"])
			}
			if _, ok := s["$schema"]; ok {
				t.Errorf("%s %s schema: $schema costs context and MCP's default (draft 2020-12) applies", tool.Name, kind)
			}
			checkSchemaNode(t, tool.Name+" "+kind, s, kind == "input")
		}
		// The arguments, exactly.
		var in struct {
			Properties map[string]any `json:"properties"`
			Required   []string       `json:"required"`
			Additional *bool          `json:"additionalProperties"`
		}
		if err := json.Unmarshal(tool.InputSchema, &in); err != nil {
			t.Fatal(err)
		}
		var names []string
		for k := range in.Properties {
			names = append(names, k)
		}
		args := toolArgs[tool.Name]
		if !sameSet(names, args.all) || !sameSet(in.Required, args.required) {
			t.Errorf("%s arguments: got %v (required %v), want %v (required %v)", tool.Name, names, in.Required, args.all, args.required)
		}
		if in.Additional == nil || *in.Additional {
			t.Errorf("%s: input schema must set additionalProperties false (unknown arguments are refused)", tool.Name)
		}
	}
}

func checkSchemaNode(t *testing.T, where string, v any, describe bool) {
	t.Helper()
	switch n := v.(type) {
	case map[string]any:
		if _, ok := n["$ref"]; ok {
			t.Errorf("%s: $ref left in a self-contained schema", where)
		}
		if _, ok := n["$defs"]; ok {
			t.Errorf("%s: $defs left in a self-contained schema", where)
		}
		for k := range n {
			if strings.HasPrefix(k, "x-") {
				t.Errorf("%s: generator extension %s left in", where, k)
			}
		}
		if props, ok := n["properties"].(map[string]any); ok {
			for name, p := range props {
				ps, _ := p.(map[string]any)
				if d, _ := ps["description"].(string); describe && strings.TrimSpace(d) == "" {
					t.Errorf("%s: property %s has no description", where, name)
				}
			}
			if req, ok := n["required"].([]any); ok {
				for _, r := range req {
					if _, ok := props[r.(string)]; !ok {
						t.Errorf("%s: required %v is not a property", where, r)
					}
				}
			}
		}
		for k, c := range n {
			if k == "enum" || k == "default" || k == "examples" {
				continue
			}
			checkSchemaNode(t, where+"/"+k, c, describe)
		}
	case []any:
		for _, c := range n {
			checkSchemaNode(t, where, c, describe)
		}
	}
}

// TestToolSchemasMatchGoTypes builds, from each schema, an instance with every property set (and
// one with only the required ones), decodes it with the generated Go type, validates it, and
// checks that encoding gives back the same keys: the Go types and the published schemas agree.
func TestToolSchemasMatchGoTypes(t *testing.T) {
	for _, tool := range mcptools.Tools {
		types, ok := toolGoTypes[tool.Name]
		if !ok {
			t.Errorf("%s: no Go types listed in toolGoTypes", tool.Name)
			continue
		}
		for i, raw := range []json.RawMessage{tool.InputSchema, tool.OutputSchema} {
			kind := [2]string{"input", "output"}[i]
			var s map[string]any
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			for _, full := range []bool{true, false} {
				inst := schemaInstance(s, full)
				data, err := json.Marshal(inst)
				if err != nil {
					t.Fatal(err)
				}
				v := types[i]()
				if err := decode(v, data); err != nil {
					t.Errorf("%s %s (all fields %t): %T does not accept a schema-valid instance: %v\n%s", tool.Name, kind, full, v, err, data)
					continue
				}
				if !full {
					continue // defaults may add fields
				}
				enc, err := v.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				var back any
				if err := json.Unmarshal(enc, &back); err != nil {
					t.Fatal(err)
				}
				var orig any
				if err := json.Unmarshal(data, &orig); err != nil {
					t.Fatal(err)
				}
				if diffs := keyDiff("", orig, back); len(diffs) > 0 {
					t.Errorf("%s %s: %T and the schema disagree:\n  %s", tool.Name, kind, v, strings.Join(diffs, "\n  "))
				} else if !reflect.DeepEqual(orig, back) {
					t.Errorf("%s %s: %T changes values:\n%s\n%s", tool.Name, kind, v, data, enc)
				}
			}
		}
	}
}

// schemaInstance returns a value valid against s: every property when full, else only the
// required ones.
func schemaInstance(s map[string]any, full bool) any {
	// A definition spelled out in another tool's output (x-describedIn) is a
	// stub pointing there: build the instance from that schema.
	if d, _ := s["description"].(string); s["properties"] == nil && strings.HasSuffix(d, "'s output schema.") {
		tool := d[strings.LastIndex(d, "see ")+len("see ") : len(d)-len("'s output schema.")]
		var full2 map[string]any
		if err := json.Unmarshal(mcptools.OutputSchemas[tool], &full2); err == nil {
			return schemaInstance(full2, full)
		}
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	if alts, ok := s["oneOf"].([]any); ok && len(alts) > 0 {
		alt := alts[0]
		if full {
			alt = alts[len(alts)-1]
		}
		return schemaInstance(alt.(map[string]any), full)
	}
	switch s["type"] {
	case "object":
		out := map[string]any{}
		required := map[string]bool{}
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				required[r.(string)] = true
			}
		}
		if props, ok := s["properties"].(map[string]any); ok {
			for k, p := range props {
				if full || required[k] {
					out[k] = schemaInstance(p.(map[string]any), full)
				}
			}
		}
		if ap, ok := s["additionalProperties"].(map[string]any); ok {
			out["some-key"] = schemaInstance(ap, full)
		}
		return out
	case "array":
		items, _ := s["items"].(map[string]any)
		if items == nil || !full {
			return []any{}
		}
		return []any{schemaInstance(items, full)}
	case "string":
		if s["format"] == "date-time" {
			return "2026-11-29T08:52:43Z"
		}
		return "x"
	case "integer", "number":
		if m, ok := s["minimum"].(float64); ok {
			return m
		}
		return 2.0
	case "boolean":
		return true
	}
	return nil
}

func indentJSON(t *testing.T, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		t.Fatalf("invalid JSON: %v", err)
	}
	b.WriteByte('\n')
	return b.Bytes()
}

func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + strconv.Itoa(i+1) + ":\n  golden:    " + x + "\n  generated: " + y
		}
	}
	return "(none)"
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}
