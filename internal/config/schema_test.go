package config

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

const committedSchemaPath = "../../schema/config/t3code.schema.json"

// compileSchema compiles the committed schema, with "format" asserted (url must be a URI).
func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	data, err := os.ReadFile(committedSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("t3code.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("t3code.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validateTOML decodes a TOML document into generic values, as an editor's TOML support does, and
// validates them against the schema.
func validateTOML(t *testing.T, s *jsonschema.Schema, src string) error {
	t.Helper()
	var raw map[string]any
	if _, err := toml.Decode(src, &raw); err != nil {
		t.Fatalf("TOML: %v\n%s", err, src)
	}
	j, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(inst)
}

// The committed schema is what the config types generate (`make generate` writes it; gencheck
// fails in CI when it is stale, this fails first in a plain `go test`).
func TestCommittedSchemaIsCurrent(t *testing.T) {
	want, err := JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(committedSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from config.JSONSchema(): run `make generate` and commit it", committedSchemaPath)
	}
}

func TestExampleFileValidatesAgainstSchema(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateTOML(t, compileSchema(t), string(data)); err != nil {
		t.Fatalf("%s does not validate against %s:\n%v", examplePath, committedSchemaPath, err)
	}
	// The example points Taplo / Even Better TOML at the committed schema, relative to itself.
	if first, _, _ := strings.Cut(string(data), "\n"); first != "#:schema ./schema/config/t3code.schema.json" {
		t.Fatalf("first line of %s is %q, want the #:schema directive", examplePath, first)
	}
}

// The schema refuses what Parse refuses and accepts what Parse accepts, for every kind of mistake
// an editor can see without running anything. (Parse checks more: malformed fnmatch patterns, a
// URL that does not parse.)
func TestSchemaAgreesWithParse(t *testing.T) {
	s := compileSchema(t)
	table := func(body string) string { return "[machines.mac]\n" + body + "\n" }
	minimal := "url = \"http://127.0.0.1:3773\"\ntoken_env = \"T3_MAC_TOKEN\"\n"
	for _, tc := range []struct {
		name, src string
		ok        bool
	}{
		{"empty file", "", true},
		{"minimal machine", table(minimal), true},
		{"every key", table(minimal + `projects = ["api-*", "/srv/*"]
model = "claudeAgent/claude-opus-5"
options = { effort = "high", fast = true }
access = "read"
approve = ["dispatch", "answer"]`), true},
		{"empty model is T3's default", table(minimal + `model = ""`), true},
		{"no machines allowed", table(minimal + `projects = []`), true},
		{"https with a path", table("url = \"https://box.example:3773/t3/\"\ntoken_env = \"X\""), true},
		{"duplicate approve entries", table(minimal + `approve = ["dispatch", "dispatch"]`), true},

		{"unknown top-level key", "colour = \"blue\"\n" + table(minimal), false},
		{"machines not a table", `machines = "mac"`, false},
		{"machine name", "[machines.-mac]\n" + minimal, false},
		{"token in the file", table(minimal + `token = "secret"`), false},
		{"unknown machine key", table(minimal + `colour = "blue"`), false},
		{"url missing", table(`token_env = "T3_MAC_TOKEN"`), false},
		{"token_env missing", table(`url = "http://127.0.0.1:3773"`), false},
		{"url empty", table("url = \"\"\ntoken_env = \"X\""), false},
		{"url not http", table("url = \"ftp://box:21\"\ntoken_env = \"X\""), false},
		{"url with a user", table("url = \"http://me:pw@box:3773\"\ntoken_env = \"X\""), false},
		{"url a number", table("url = 3773\ntoken_env = \"X\""), false},
		{"token_env not a variable name", table("url = \"http://box:3773\"\ntoken_env = \"1TOKEN\""), false},
		{"projects a string", table(minimal + `projects = "*"`), false},
		{"projects entry a number", table(minimal + `projects = ["*", 3]`), false},
		{"model without instance", table(minimal + `model = "claude-opus-5"`), false},
		{"model with a space", table(minimal + `model = "claudeAgent/claude opus"`), false},
		{"options a string", table(minimal + `options = "high"`), false},
		{"option a number", table(minimal + `options = { effort = 3 }`), false},
		{"access", table(minimal + `access = "write"`), false},
		{"approve value", table(minimal + `approve = ["deploy"]`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, parseErr := Parse([]byte(tc.src), "")
			schemaErr := validateTOML(t, s, tc.src)
			if (parseErr == nil) != tc.ok {
				t.Errorf("Parse: %v, want ok=%v", parseErr, tc.ok)
			}
			if (schemaErr == nil) != tc.ok {
				t.Errorf("schema: %v, want ok=%v", schemaErr, tc.ok)
			}
		})
	}
}

// The keys Parse knows are the schema's, in the order its messages list them.
func TestKnownKeysAreTheSchemaTableKeys(t *testing.T) {
	want := []string{"url", "token_env", "projects", "model", "options", "access", "approve", "compression"}
	if strings.Join(knownMachineKeys, ",") != strings.Join(want, ",") {
		t.Fatalf("knownMachineKeys = %v, want %v", knownMachineKeys, want)
	}
	var doc map[string]any
	b, err := JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	machines := doc["properties"].(map[string]any)["machines"].(map[string]any)
	tbl := machines["patternProperties"].(map[string]any)[machineNameRe.String()].(map[string]any)
	props := tbl["properties"].(map[string]any)
	if len(props) != len(want) {
		t.Fatalf("schema table keys %v, want %v", props, want)
	}
	for _, k := range want {
		if _, ok := props[k]; !ok {
			t.Errorf("schema has no key %q", k)
		}
	}
}
