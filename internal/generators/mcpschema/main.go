// Command mcpschema turns schema/mcp/tools.json into gen/mcptools/schemas_gen.go: for each tool
// listed in the schema's x-tools, a self-contained input and output JSON Schema (every $ref inlined,
// so an MCP client can read it standalone) plus the tool's name, title, description and behaviour
// hints, as Go data. It is run by `go generate ./tools.go`; the output depends only on the input
// file, so regenerating is deterministic.
//
// Every tool's schemas go into every agent's context (tools/list), so a large definition that
// several tools return is spelled out once: a definition marked "x-describedIn": "t3_thread" is
// inlined in full only in that tool's output schema; elsewhere it becomes
// {"type": "object", "description": "<its description> Fields: see t3_thread's output schema."}.
// The schemas carry no "$schema": MCP's default dialect is draft 2020-12.
//
//	go run ./internal/generators/mcpschema -in schema/mcp/tools.json -out gen/mcptools/schemas_gen.go -package mcptools
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
)

func main() {
	in := flag.String("in", "schema/mcp/tools.json", "tool schema file")
	out := flag.String("out", "gen/mcptools/schemas_gen.go", "Go file to write")
	pkg := flag.String("package", "mcptools", "Go package name")
	flag.Parse()
	if err := run(*in, *out, *pkg); err != nil {
		fmt.Fprintln(os.Stderr, "mcpschema:", err)
		os.Exit(1)
	}
}

func run(in, out, pkg string) error {
	data, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	src, err := generate(data, filepath.ToSlash(in), pkg)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, src, 0o644)
}

// tool is one entry of x-tools.
type tool struct {
	Name        string `json:"name"`
	Title       string `json:"title"`
	Description string `json:"description"`
	ReadOnly    bool   `json:"readOnly"`
	Destructive bool   `json:"destructive"`
	Idempotent  bool   `json:"idempotent"`
	Input       string `json:"input"`
	Output      string `json:"output"`

	goName       string // Machines for t3_machines
	inputSchema  []byte // indented, self-contained
	outputSchema []byte
	inputType    string // the Go type jschemagen gives the definition
	outputType   string
}

func generate(data []byte, srcName, pkg string) ([]byte, error) {
	root, err := parse(data)
	if err != nil {
		return nil, err
	}
	rootObj, ok := root.(*object)
	if !ok {
		return nil, errors.New("the root is not an object")
	}
	defsV, _ := rootObj.get("$defs")
	defs, ok := defsV.(*object)
	if !ok {
		return nil, errors.New("no $defs object")
	}
	toolsV, ok := rootObj.get("x-tools")
	if !ok {
		return nil, errors.New("no x-tools list")
	}
	var tools []*tool
	if err := json.Unmarshal(encode(toolsV, false), &tools); err != nil {
		return nil, fmt.Errorf("x-tools: %w", err)
	}
	if len(tools) == 0 {
		return nil, errors.New("x-tools is empty")
	}
	seen := map[string]bool{}
	for _, t := range tools {
		if t.Name == "" || t.Description == "" || t.Input == "" || t.Output == "" {
			return nil, fmt.Errorf("x-tools entry %q: name, description, input and output are required", t.Name)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("x-tools: %s listed twice", t.Name)
		}
		seen[t.Name] = true
		t.goName = goName(t.Name)
		r := &resolver{defs: defs, tool: t.Name}
		if t.inputSchema, t.inputType, err = r.toolSchema(t.Input); err != nil {
			return nil, fmt.Errorf("%s input: %w", t.Name, err)
		}
		if t.outputSchema, t.outputType, err = r.toolSchema(t.Output); err != nil {
			return nil, fmt.Errorf("%s output: %w", t.Name, err)
		}
	}
	return render(tools, srcName, pkg)
}

// goName maps t3_machines to Machines.
func goName(tool string) string {
	var b strings.Builder
	for _, part := range strings.Split(strings.TrimPrefix(tool, "t3_"), "_") {
		if part == "" {
			continue
		}
		r := []rune(part)
		r[0] = unicode.ToUpper(r[0])
		b.WriteString(string(r))
	}
	return b.String()
}

type resolver struct {
	defs  *object
	tool  string // the tool whose schema is being built
	stack []string
}

// describedInKey marks a definition spelled out in one tool's output only.
const describedInKey = "x-describedIn"

// stub is what a definition described in another tool's output becomes.
func stub(def *object, tool string) *object {
	desc, _ := def.get("description")
	d, _ := desc.(string)
	out := &object{vals: map[string]any{}}
	out.set("type", "object")
	out.set("description", strings.TrimSpace(d+" Fields: see "+tool+"'s output schema."))
	return out
}

// toolSchema returns the definition name's schema with every $ref inlined, plus the Go type
// jschemagen emits for it (a definition that is only a $ref becomes its target's type).
func (r *resolver) toolSchema(name string) ([]byte, string, error) {
	goType := name
	for seen := 0; ; seen++ {
		d, ok := r.defs.get(goType)
		if !ok {
			return nil, "", fmt.Errorf("no $defs/%s", goType)
		}
		o, ok := d.(*object)
		if !ok || len(o.keys) != 1 || seen > 16 {
			break
		}
		ref, ok := o.get("$ref")
		s, isStr := ref.(string)
		if !ok || !isStr {
			break
		}
		target, err := defName(s)
		if err != nil {
			return nil, "", err
		}
		goType = target
	}
	v, err := r.inline(&object{keys: []string{"$ref"}, vals: map[string]any{"$ref": "#/$defs/" + name}})
	if err != nil {
		return nil, "", err
	}
	o, ok := v.(*object)
	if !ok {
		return nil, "", errors.New("not an object schema")
	}
	if t, _ := o.get("type"); t != "object" {
		return nil, "", errors.New(`MCP needs "type": "object" at the top of a tool schema`)
	}
	return encode(o, true), goType, nil
}

func defName(ref string) (string, error) {
	name, ok := strings.CutPrefix(ref, "#/$defs/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("unsupported $ref %q: only #/$defs/Name within tools.json", ref)
	}
	return name, nil
}

// inline copies v with every {"$ref": "#/$defs/X", …siblings} replaced by a copy of X whose keys
// the siblings override, and without generator extensions (x-ogen-*).
func (r *resolver) inline(v any) (any, error) {
	switch v := v.(type) {
	case *object:
		if ref, ok := v.get("$ref"); ok {
			s, isStr := ref.(string)
			if !isStr {
				return nil, errors.New("$ref is not a string")
			}
			name, err := defName(s)
			if err != nil {
				return nil, err
			}
			for _, n := range r.stack {
				if n == name {
					return nil, fmt.Errorf("recursive $ref %s (via %s): cannot inline", name, strings.Join(r.stack, " → "))
				}
			}
			target, ok := r.defs.get(name)
			if !ok {
				return nil, fmt.Errorf("$ref %s: no such definition", s)
			}
			var resolved any
			if def, isObj := target.(*object); isObj && len(r.stack) > 0 {
				if in, ok := def.get(describedInKey); ok {
					if in, _ := in.(string); in != "" && in != r.tool {
						resolved = stub(def, in)
					}
				}
			}
			if resolved == nil {
				r.stack = append(r.stack, name)
				resolved, err = r.inline(target)
				r.stack = r.stack[:len(r.stack)-1]
				if err != nil {
					return nil, err
				}
			}
			obj, ok := resolved.(*object)
			if !ok {
				return nil, fmt.Errorf("$ref %s is not a schema object", s)
			}
			out := obj.clone()
			for _, k := range v.keys {
				if k == "$ref" || strings.HasPrefix(k, "x-ogen") {
					continue
				}
				sib, err := r.inline(v.vals[k])
				if err != nil {
					return nil, err
				}
				out.set(k, sib)
			}
			return out, nil
		}
		out := &object{vals: map[string]any{}}
		for _, k := range v.keys {
			if strings.HasPrefix(k, "x-ogen") || k == describedInKey || k == "$id" || k == "$schema" {
				continue
			}
			c, err := r.inline(v.vals[k])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out.set(k, c)
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := r.inline(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	default:
		return v, nil
	}
}

func render(tools []*tool, srcName, pkg string) ([]byte, error) {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("// Code generated by internal/generators/mcpschema from %s. DO NOT EDIT.\n\n", srcName)
	p("package %s\n\n", pkg)
	p("import \"encoding/json\"\n\n")
	p("// Names of the MCP tools, in the order of Tools.\nconst (\n")
	for _, t := range tools {
		p("\tTool%s = %s\n", t.goName, strconv.Quote(t.Name))
	}
	p(")\n\n")
	p(`// ToolSpec is one MCP tool as declared in the tool schema: what tools/list shows for it.
type ToolSpec struct {
	// Name is the tool's name (a Tool… constant).
	Name string
	// Title is a short human-readable name.
	Title string
	// Description tells an agent when and how to call the tool.
	Description string
	// ReadOnly, Destructive and Idempotent are the MCP behaviour hints (readOnlyHint, destructiveHint,
	// idempotentHint).
	ReadOnly, Destructive, Idempotent bool
	// InputSchema and OutputSchema are self-contained JSON Schemas (draft 2020-12, no $ref) with
	// "type": "object" at the top. Do not modify them: they are shared.
	InputSchema, OutputSchema json.RawMessage
}

`)
	p("// Tools lists every tool, in the order the schema declares them.\nvar Tools = []ToolSpec{\n")
	for _, t := range tools {
		p("\t{\n")
		p("\t\tName:        Tool%s,\n", t.goName)
		p("\t\tTitle:       %s,\n", strconv.Quote(t.Title))
		p("\t\tDescription: %s,\n", strconv.Quote(t.Description))
		p("\t\tReadOnly:    %t,\n", t.ReadOnly)
		p("\t\tDestructive: %t,\n", t.Destructive)
		p("\t\tIdempotent:  %t,\n", t.Idempotent)
		p("\t\tInputSchema: json.RawMessage(input%s),\n", t.goName)
		p("\t\tOutputSchema: json.RawMessage(output%s),\n", t.goName)
		p("\t},\n")
	}
	p("}\n\n")
	p("// InputSchemas maps a tool name to the JSON Schema of its arguments. Do not modify the values.\nvar InputSchemas = map[string]json.RawMessage{\n")
	for _, t := range tools {
		p("\tTool%s: json.RawMessage(input%s),\n", t.goName, t.goName)
	}
	p("}\n\n")
	p("// OutputSchemas maps a tool name to the JSON Schema of its structured result. Do not modify the\n// values.\nvar OutputSchemas = map[string]json.RawMessage{\n")
	for _, t := range tools {
		p("\tTool%s: json.RawMessage(output%s),\n", t.goName, t.goName)
	}
	p("}\n")
	for _, t := range tools {
		p("\n// input%s is the input schema of %s (Go type %s).\nconst input%s = %s\n", t.goName, t.Name, t.inputType, t.goName, rawString(t.inputSchema))
		p("\n// output%s is the output schema of %s (Go type %s).\nconst output%s = %s\n", t.goName, t.Name, t.outputType, t.goName, rawString(t.outputSchema))
	}
	src, err := format.Source(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("format generated code: %w\n%s", err, b.Bytes())
	}
	return src, nil
}

// rawString writes s as a Go raw string literal, splicing in any backquote.
func rawString(s []byte) string {
	return "`" + strings.ReplaceAll(string(s), "`", "` + \"`\" + `") + "`"
}

// object is a JSON object that keeps its keys in written order.
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

func (o *object) set(k string, v any) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *object) clone() *object {
	c := &object{keys: append([]string(nil), o.keys...), vals: make(map[string]any, len(o.vals))}
	for k, v := range o.vals {
		c.vals[k] = v
	}
	return c
}

// parse decodes JSON into *object, []any and scalars (json.Number, string, bool, nil).
func parse(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := parseValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

func parseValue(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		o := &object{vals: map[string]any{}}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k := kt.(string)
			if _, dup := o.vals[k]; dup {
				return nil, fmt.Errorf("duplicate key %q", k)
			}
			v, err := parseValue(d)
			if err != nil {
				return nil, err
			}
			o.set(k, v)
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return o, nil
	case json.Delim('['):
		a := []any{}
		for d.More() {
			v, err := parseValue(d)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return a, nil
	default:
		return tok, nil
	}
}

// encode writes v as JSON, keys in their kept order, indented by two spaces or compact.
func encode(v any, indent bool) []byte {
	var b bytes.Buffer
	writeValue(&b, v)
	if !indent {
		return b.Bytes()
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		panic(err) // writeValue produces valid JSON
	}
	return out.Bytes()
}

func writeValue(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case *object:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeScalar(b, k)
			b.WriteByte(':')
			writeValue(b, v.vals[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeValue(b, e)
		}
		b.WriteByte(']')
	default:
		writeScalar(b, v)
	}
}

func writeScalar(b *bytes.Buffer, v any) {
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		panic(err)
	}
	b.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}
