package config

import (
	"encoding/json"
	"reflect"
	"strings"

	"github.com/invopop/jsonschema"
)

// File is the shape of t3code.toml, for the JSON Schema that editors use to complete and check the
// file (schema/config/t3code.schema.json, printed by `t3code-mcp config-schema`). Parse does not
// decode into it (it checks the file key by key so that every error names the machine and key), but
// the keys Parse accepts are this type's: knownMachineKeys is read from MachineTable's tags, so the
// schema and the parser cannot drift apart on which keys exist.
type File struct {
	Machines map[string]MachineTable `toml:"machines,omitempty" jsonschema_description:"The T3 Code machines agents may use, one [machines.NAME] table each. NAME is how agents refer to the machine: letters, digits, '_', '.', '-', starting with a letter or digit."`
}

// MachineTable is one [machines.NAME] table as written in the file; Machine is what Parse makes
// of it.
type MachineTable struct {
	URL         string         `toml:"url" jsonschema:"required,format=uri" jsonschema_description:"Where 't3 serve' listens: http:// or https://, host and port; no user or password (the token goes in the variable named by token_env)."`
	TokenEnv    string         `toml:"token_env" jsonschema:"required" jsonschema_description:"The NAME of the environment variable that holds this machine's bearer token. The token itself never goes in the file."`
	Projects    []string       `toml:"projects,omitempty" jsonschema_description:"Which projects agents may see and use: fnmatch patterns (*, ?, [abc], [!abc], \\ escapes) matched against a project's title or workspace root. Default [\"*\"], every project; [] allows none."`
	Model       string         `toml:"model,omitempty" jsonschema_description:"The model new threads use, as instanceId/model (e.g. claudeAgent/claude-opus-5). Without it T3 uses its own default."`
	Options     map[string]any `toml:"options,omitempty" jsonschema_description:"Model options passed with the model, e.g. { effort = \"high\" }; each value is a string or a boolean."`
	Access      string         `toml:"access,omitempty" jsonschema:"default=operate" jsonschema_description:"\"operate\" (default): agents may read and send commands. \"read\": agents may only read; t3_dispatch, t3_answer and t3_interrupt are refused."`
	Approve     []string       `toml:"approve,omitempty" jsonschema_description:"Actions that need a person's approval (MCP elicitation) before they are sent to this machine."`
	Compression string         `toml:"compression,omitempty" jsonschema:"default=auto" jsonschema_description:"Whether the machine's HTTP answers come gzipped. \"auto\" (default): uncompressed from localhost or a loopback address (gzip there only costs CPU on both sides), gzip from any other host. \"gzip\": always (a loopback URL that is a tunnel to a distant machine). \"none\": never (a fast network)."`
}

// JSONSchemaExtend adds what tags cannot say, from the same values Parse checks against.
func (File) JSONSchemaExtend(s *jsonschema.Schema) {
	machines, _ := s.Properties.Get("machines")
	// Machine names are checked by pattern; the generated schema allowed any key.
	table := machines.AdditionalProperties
	machines.PatternProperties = map[string]*jsonschema.Schema{machineNameRe.String(): table}
	machines.AdditionalProperties = jsonschema.FalseSchema
}

// JSONSchemaExtend adds what tags cannot say, from the same values Parse checks against.
func (MachineTable) JSONSchemaExtend(s *jsonschema.Schema) {
	prop := func(key string) *jsonschema.Schema {
		p, _ := s.Properties.Get(key)
		return p
	}
	// A URL with user info is refused by Parse; the pattern says so to an editor.
	prop("url").Pattern = `^https?://[^/?#@\s]+([/?#]\S*)?$`
	prop("token_env").Pattern = envNameRe.String()
	prop("model").Pattern = `^([^/\s]+/\S+)?$` // "" is T3's default model
	prop("options").AdditionalProperties = &jsonschema.Schema{AnyOf: []*jsonschema.Schema{{Type: "string"}, {Type: "boolean"}}}
	prop("projects").Default = defaultProjects
	prop("access").Enum = []any{AccessOperate, AccessRead}
	prop("approve").Items.Enum = anySlice(approvable)
	prop("compression").Enum = anySlice(compressions)
	// Taplo (Even Better TOML) writes these keys when it completes a new [machines.NAME] table.
	s.Extras = map[string]any{"x-taplo": map[string]any{"initKeys": []string{"url", "token_env"}}}
}

// JSONSchema returns the JSON Schema of t3code.toml, indented, ending in a newline. It is draft-07
// with every definition inline (no $ref), which the TOML editors' schema support reads (Taplo
// documents draft 4 and later).
func JSONSchema() ([]byte, error) {
	r := &jsonschema.Reflector{
		FieldNameTag:               "toml",
		RequiredFromJSONSchemaTags: true,
		DoNotReference:             true,
		ExpandedStruct:             true,
		Anonymous:                  true,
	}
	s := r.Reflect(File{})
	s.Version = "http://json-schema.org/draft-07/schema#"
	s.Title = "t3code.toml"
	s.Description = "The T3 Code machines t3code-mcp may use (docs/configuration.md)."
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// tableKeys lists a table type's keys in field order, from its toml tags.
func tableKeys(t reflect.Type) []string {
	keys := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		keys = append(keys, name)
	}
	return keys
}

func anySlice(xs []string) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}
