package tools

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// argSchema is the part of a tool's input schema that says what an argument
// may be: enough to tell a caller which field is wrong, what it should be
// and what was sent, in place of the generated decoder's byte offsets.
type argSchema struct {
	Type                 any                   `json:"type"` // a name or a list of names
	Enum                 []any                 `json:"enum"`
	Properties           map[string]*argSchema `json:"properties"`
	Required             []string              `json:"required"`
	AdditionalProperties json.RawMessage       `json:"additionalProperties"` // false, or a schema
	Items                *argSchema            `json:"items"`
	OneOf                []*argSchema          `json:"oneOf"`
	AnyOf                []*argSchema          `json:"anyOf"`
}

var (
	inputSchemasOnce sync.Once
	inputSchemas     map[string]*argSchema
)

func inputSchema(tool string) *argSchema {
	inputSchemasOnce.Do(func() {
		inputSchemas = map[string]*argSchema{}
		for _, s := range mcptools.Tools {
			var a argSchema
			if json.Unmarshal(s.InputSchema, &a) == nil {
				inputSchemas[s.Name] = &a
			}
		}
	})
	return inputSchemas[tool]
}

// explainArgs says what is wrong with a tool's arguments in the caller's
// terms: an unknown argument (and the ones the tool takes), a missing one, or
// one of the wrong type (the field, what it must be, what was sent). It
// returns "" when it finds nothing to say, and the decoder's error stands.
func explainArgs(tool string, raw json.RawMessage) string {
	s := inputSchema(tool)
	if s == nil {
		return ""
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "the arguments are not valid JSON"
	}
	return s.check("", v)
}

// check returns the first problem with v at path, or "".
func (s *argSchema) check(path string, v any) string {
	if len(s.OneOf) > 0 || len(s.AnyOf) > 0 {
		alts := append(slices.Clone(s.OneOf), s.AnyOf...)
		for _, a := range alts {
			if a.check(path, v) == "" {
				return ""
			}
		}
		return fmt.Sprintf("%s must be %s; got %s", field(path), s.expected(), given(v))
	}
	if !s.typeAllows(v) {
		if path == "" {
			return "the arguments must be a JSON object; got " + given(v)
		}
		return fmt.Sprintf("%s must be %s; got %s", field(path), s.expected(), given(v))
	}
	if len(s.Enum) > 0 && !slices.ContainsFunc(s.Enum, func(e any) bool { return e == v }) {
		return fmt.Sprintf("%s must be %s; got %s", field(path), s.expected(), given(v))
	}
	switch v := v.(type) {
	case map[string]any:
		var extra *argSchema
		closed := string(s.AdditionalProperties) == "false"
		if !closed && len(s.AdditionalProperties) > 0 {
			_ = json.Unmarshal(s.AdditionalProperties, &extra)
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			sub, ok := s.Properties[k]
			switch {
			case ok:
			case extra != nil:
				sub = extra
			case closed:
				return fmt.Sprintf("unknown %s; %s", field(join(path, k)), s.takes(path))
			default:
				continue
			}
			if msg := sub.check(join(path, k), v[k]); msg != "" {
				return msg
			}
		}
		for _, r := range s.Required {
			if _, ok := v[r]; !ok {
				return fmt.Sprintf("missing %s (%s)", field(join(path, r)), s.Properties[r].expected())
			}
		}
	case []any:
		if s.Items != nil {
			for i, e := range v {
				if msg := s.Items.check(fmt.Sprintf("%s[%d]", path, i), e); msg != "" {
					return msg
				}
			}
		}
	}
	return ""
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func field(path string) string { return fmt.Sprintf("argument %q", text.Cut(path, 64)) }

// takes lists the arguments an object takes, required ones first.
func (s *argSchema) takes(path string) string {
	var opt []string
	for k := range s.Properties {
		if !slices.Contains(s.Required, k) {
			opt = append(opt, k)
		}
	}
	slices.Sort(opt)
	what := "this tool takes"
	if path != "" {
		what = fmt.Sprintf("%s takes", field(path))
	}
	switch {
	case len(s.Required) == 0:
		return fmt.Sprintf("%s: %s", what, strings.Join(opt, ", "))
	case len(opt) == 0:
		return fmt.Sprintf("%s: %s", what, strings.Join(s.Required, ", "))
	}
	return fmt.Sprintf("%s: %s (required) and %s", what, strings.Join(s.Required, ", "), strings.Join(opt, ", "))
}

func (s *argSchema) types() []string {
	switch t := s.Type.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, e := range t {
			if n, ok := e.(string); ok {
				out = append(out, n)
			}
		}
		return out
	}
	return nil
}

func (s *argSchema) typeAllows(v any) bool {
	ts := s.types()
	if len(ts) == 0 {
		return true
	}
	for _, t := range ts {
		switch x := v.(type) {
		case string:
			if t == "string" {
				return true
			}
		case float64:
			if t == "number" || (t == "integer" && x == float64(int64(x))) {
				return true
			}
		case bool:
			if t == "boolean" {
				return true
			}
		case nil:
			if t == "null" {
				return true
			}
		case map[string]any:
			if t == "object" {
				return true
			}
		case []any:
			if t == "array" {
				return true
			}
		}
	}
	return false
}

// expected is what the schema allows, in words.
func (s *argSchema) expected() string {
	if s == nil {
		return "a value"
	}
	if len(s.Enum) > 0 {
		var vs []string
		for _, e := range s.Enum {
			b, _ := json.Marshal(e)
			vs = append(vs, string(b))
		}
		return "one of " + strings.Join(vs, ", ")
	}
	if alts := append(slices.Clone(s.OneOf), s.AnyOf...); len(alts) > 0 {
		var ws []string
		for _, a := range alts {
			ws = append(ws, a.expected())
		}
		return strings.Join(ws, " or ")
	}
	var ws []string
	for _, t := range s.types() {
		switch t {
		case "string":
			ws = append(ws, "a string")
		case "integer":
			ws = append(ws, "a whole number")
		case "number":
			ws = append(ws, "a number")
		case "boolean":
			ws = append(ws, "true or false")
		case "object":
			ws = append(ws, "an object")
		case "array":
			w := "an array"
			if s.Items != nil && len(s.Items.types()) == 1 {
				w = "an array of " + strings.TrimPrefix(strings.TrimPrefix(s.Items.expected(), "a "), "an ") + "s"
			}
			ws = append(ws, w)
		case "null":
			ws = append(ws, "null")
		}
	}
	if len(ws) == 0 {
		return "a value"
	}
	return strings.Join(ws, " or ")
}

// given describes a value a caller sent, briefly.
func given(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", text.Cut(x, 40))
	case float64:
		return "the number " + strings.TrimSuffix(fmt.Sprintf("%g", x), ".0")
	case bool:
		return fmt.Sprintf("%t", x)
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return fmt.Sprintf("%v", v)
}
