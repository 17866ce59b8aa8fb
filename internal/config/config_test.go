package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const examplePath = "../../t3code.example.toml"

func TestExampleFileParses(t *testing.T) {
	cfg, err := Load(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Machines) != 2 {
		t.Fatalf("machines = %d, want 2", len(cfg.Machines))
	}
	// Sorted by name.
	if cfg.Machines[0].Name != "buildbox" || cfg.Machines[1].Name != "mac" {
		t.Fatalf("order = %s, %s", cfg.Machines[0].Name, cfg.Machines[1].Name)
	}
	mac, ok := cfg.Machine("mac")
	if !ok {
		t.Fatal("no machine mac")
	}
	want := Machine{
		Name:     "mac",
		URL:      "http://100.64.0.7:3773",
		TokenEnv: "T3_MAC_TOKEN",
		Projects: []string{"*"},
		Model:    "claudeAgent/claude-opus-5",
		Options:  map[string]any{"effort": "high", "contextWindow": "1m"},
		Access:   AccessOperate,
		Approve:  []string{"dispatch", "interrupt", "answer"},
		// Compression: no key, auto.
		Compression: CompressionAuto,
	}
	if !reflect.DeepEqual(mac, want) {
		t.Fatalf("mac = %#v\nwant %#v", mac, want)
	}
	inst, model, ok := mac.ModelSelection()
	if !ok || inst != "claudeAgent" || model != "claude-opus-5" {
		t.Fatalf("ModelSelection = %q %q %v", inst, model, ok)
	}
	bb, _ := cfg.Machine("buildbox")
	if !bb.ReadOnly() || bb.Approves(ApproveDispatch) || bb.Model != "" {
		t.Fatalf("buildbox = %#v", bb)
	}
	if _, _, ok := bb.ModelSelection(); ok {
		t.Fatal("buildbox has no model")
	}
	if _, ok := cfg.Machine("nope"); ok {
		t.Fatal("found a machine that does not exist")
	}
	if cfg.Path != examplePath {
		t.Fatalf("Path = %q", cfg.Path)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`
[machines.x]
url = "https://x.example/"
token_env = "X_TOKEN"
`), "t3code.toml")
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Machines[0]
	if m.URL != "https://x.example" {
		t.Errorf("URL = %q, want trailing slash trimmed", m.URL)
	}
	if !reflect.DeepEqual(m.Projects, []string{"*"}) {
		t.Errorf("Projects = %q, want [*]", m.Projects)
	}
	if m.Access != AccessOperate || m.ReadOnly() {
		t.Errorf("Access = %q", m.Access)
	}
	if m.Approve != nil || m.Model != "" || m.Options != nil {
		t.Errorf("unexpected optional values: %#v", m)
	}
}

func TestZeroMachinesIsValid(t *testing.T) {
	for _, src := range []string{"", "# nothing here\n", "[machines]\n"} {
		cfg, err := Parse([]byte(src), "t3code.toml")
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if len(cfg.Machines) != 0 {
			t.Fatalf("%q: machines = %d", src, len(cfg.Machines))
		}
	}
}

func TestEmptyProjectsAllowsNothing(t *testing.T) {
	cfg, err := Parse([]byte("[machines.a]\nurl=\"http://h:1\"\ntoken_env=\"A\"\nprojects=[]\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Machines[0].Allows("anything", "/any") {
		t.Fatal("projects = [] must allow nothing")
	}
	if cfg.Path != "t3code.toml" {
		t.Fatalf("default path = %q", cfg.Path)
	}
}

func TestApproveDeduplicated(t *testing.T) {
	cfg, err := Parse([]byte("[machines.a]\nurl=\"http://h:1\"\ntoken_env=\"A\"\napprove=[\"answer\",\"answer\",\"dispatch\"]\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Machines[0].Approve; !reflect.DeepEqual(got, []string{"answer", "dispatch"}) {
		t.Fatalf("Approve = %q", got)
	}
}

func TestCompressionValues(t *testing.T) {
	for line, want := range map[string]string{"": CompressionAuto, `compression = "auto"`: CompressionAuto, `compression = "gzip"`: CompressionGzip, `compression = "none"`: CompressionNone} {
		cfg, err := Parse([]byte(machine(line)), "")
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Machines[0].Compression; got != want {
			t.Fatalf("%q: Compression = %q, want %q", line, got, want)
		}
	}
}

// machine builds a [machines.mac] table from the required keys plus extra lines.
func machine(extra string) string {
	return "[machines.mac]\nurl = \"http://100.64.0.7:3773\"\ntoken_env = \"T3_MAC_TOKEN\"\n" + extra + "\n"
}

func TestParseErrors(t *testing.T) {
	const secret = "sekrit-value-123"
	cases := []struct {
		name string
		src  string
		want string // the whole message
	}{
		{"syntax", "[machines.mac\n", `t3code.toml: line 2: expected`},
		{"unknown top-level key", "debug = true\n", `t3code.toml: unknown key "debug"`},
		{"machines not a table", "machines = 3\n", `t3code.toml: key "machines" must be tables like [machines.mac], got an integer`},
		{"machine not a table", "[machines]\nmac = 1\n", `t3code.toml: machine "mac": must be a table like [machines.mac], got an integer`},
		{"bad machine name", "[machines.\"my mac\"]\nurl=\"http://h:1\"\ntoken_env=\"A\"\n", `t3code.toml: machine "my mac": the name must start`},
		{"unknown key", machine(`colour = "blue"`), `t3code.toml: machine "mac": unknown key "colour" (known keys: url, token_env, projects, model, options, access, approve, compression)`},
		{"token in file", machine(`token = "` + secret + `"`), `t3code.toml: machine "mac": key "token": tokens never go in the config file; put the token in an environment variable and name that variable with token_env`},
		{"missing url", "[machines.mac]\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": is required`},
		{"empty url", "[machines.mac]\nurl = \"\"\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": is required`},
		{"url not a string", "[machines.mac]\nurl = 3773\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": must be a string, got an integer`},
		{"url not http", "[machines.mac]\nurl = \"ftp://h:1\"\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": "ftp://h:1" must start with http:// or https://`},
		{"url bare host", "[machines.mac]\nurl = \"100.64.0.7:3773\"\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": `},
		{"url no host", "[machines.mac]\nurl = \"http://\"\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": "http://" has no host`},
		{"url unparsable", "[machines.mac]\nurl = \"http://h:port\"\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": "http://h:port" is not a URL`},
		{"url with credentials", "[machines.mac]\nurl = \"http://me:" + secret + "@h:1\"\ntoken_env = \"T\"\n", `t3code.toml: machine "mac": key "url": must not contain a user or password`},
		{"missing token_env", "[machines.mac]\nurl = \"http://h:1\"\n", `t3code.toml: machine "mac": key "token_env": is required: the name of the environment variable that holds this machine's token, e.g. token_env = "T3_MAC_TOKEN"`},
		{"token_env not a name", "[machines.mac]\nurl = \"http://h:1\"\ntoken_env = \"$T3 TOKEN\"\n", `t3code.toml: machine "mac": key "token_env": "$T3 TOKEN" is not an environment variable name`},
		{"token_env not a string", "[machines.mac]\nurl = \"http://h:1\"\ntoken_env = true\n", `t3code.toml: machine "mac": key "token_env": must be a string, got a boolean`},
		{"malformed pattern", machine(`projects = ["ok", "[abc"]`), `t3code.toml: machine "mac": key "projects": pattern "[abc" is malformed: missing ]`},
		{"trailing backslash", machine(`projects = ['abc\']`), `t3code.toml: machine "mac": key "projects": pattern "abc\\" is malformed: trailing backslash escapes nothing`},
		{"reversed range", machine(`projects = ["[z-a]"]`), `t3code.toml: machine "mac": key "projects": pattern "[z-a]" is malformed: range 'z'-'a' is reversed`},
		{"projects not a list", machine(`projects = "*"`), `t3code.toml: machine "mac": key "projects": must be a list of strings, got a string`},
		{"projects entry not a string", machine(`projects = ["a", 2]`), `t3code.toml: machine "mac": key "projects": entry 2 must be a string, got an integer`},
		{"model without slash", machine(`model = "claude-opus-5"`), `t3code.toml: machine "mac": key "model": "claude-opus-5" is not instanceId/model, e.g. "claudeAgent/claude-opus-5"`},
		{"model empty instance", machine(`model = "/claude"`), `t3code.toml: machine "mac": key "model": "/claude" is not instanceId/model`},
		{"model empty name", machine(`model = "claudeAgent/"`), `t3code.toml: machine "mac": key "model": "claudeAgent/" is not instanceId/model`},
		{"model with space", machine(`model = "claude Agent/x"`), `t3code.toml: machine "mac": key "model": "claude Agent/x" is not instanceId/model`},
		{"model not a string", machine(`model = 5`), `t3code.toml: machine "mac": key "model": must be a string, got an integer`},
		{"options not a table", machine(`options = "high"`), `t3code.toml: machine "mac": key "options": must be a table like { effort = "high" }, got a string`},
		{"option integer", machine(`options = { effort = "high", budget = 3 }`), `t3code.toml: machine "mac": key "options.budget": must be a string or a boolean, got an integer`},
		{"option list", machine(`options = { tags = ["a"] }`), `t3code.toml: machine "mac": key "options.tags": must be a string or a boolean, got a list`},
		{"option float", machine(`options = { t = 0.5 }`), `t3code.toml: machine "mac": key "options.t": must be a string or a boolean, got a float`},
		{"option date", machine(`options = { d = 2024-01-01 }`), `t3code.toml: machine "mac": key "options.d": must be a string or a boolean, got a date/time`},
		{"bad access", machine(`access = "write"`), `t3code.toml: machine "mac": key "access": "write" is not one of "operate", "read"`},
		{"access not a string", machine(`access = false`), `t3code.toml: machine "mac": key "access": must be a string, got a boolean`},
		{"bad compression", machine(`compression = "br"`), `t3code.toml: machine "mac": key "compression": "br" is not one of "auto", "gzip", "none"`},
		{"compression not a string", machine(`compression = true`), `t3code.toml: machine "mac": key "compression": must be a string, got a boolean`},
		{"unknown approve", machine(`approve = ["dispatch", "delete"]`), `t3code.toml: machine "mac": key "approve": "delete" is not one of "dispatch", "interrupt", "answer"`},
		{"approve not a list", machine(`approve = "dispatch"`), `t3code.toml: machine "mac": key "approve": must be a list of strings, got a string`},
		{"approve table entry", machine(`approve = [{a = 1}]`), `t3code.toml: machine "mac": key "approve": entry 1 must be a string, got a table`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.src), "t3code.toml")
			if err == nil {
				t.Fatalf("no error; config %#v", cfg)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error:\n  %s\nwant prefix:\n  %s", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the secret: %s", err)
			}
		})
	}
}

func TestLoadMissingFileNamesIt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v, want it to name %s", err, p)
	}
}

func TestLoadErrorNamesPath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t3code.toml")
	if err := os.WriteFile(p, []byte(machine(`access = "x"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+`: machine "mac": key "access"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestToken(t *testing.T) {
	m := Machine{Name: "mac", TokenEnv: "T3CODE_MCP_TEST_TOKEN_X"}
	t.Setenv("T3CODE_MCP_TEST_TOKEN_X", "tok-123")
	if tok, err := m.Token(); err != nil || tok != "tok-123" {
		t.Fatalf("Token = %q, %v", tok, err)
	}

	t.Setenv("T3CODE_MCP_TEST_TOKEN_X", "  ")
	_, err := m.Token()
	if err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_TEST_TOKEN_X") || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty: err = %v", err)
	}

	os.Unsetenv("T3CODE_MCP_TEST_TOKEN_X") // t.Setenv restores the original value afterwards
	_, err = m.Token()
	if err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_TEST_TOKEN_X") || !strings.Contains(err.Error(), "not set") || !strings.Contains(err.Error(), `"mac"`) {
		t.Fatalf("unset: err = %v", err)
	}
}

func TestAllows(t *testing.T) {
	m := Machine{Projects: []string{"api-*", "/srv/repos/*", "[!_]*-docs"}}
	cases := []struct {
		title, root string
		want        bool
	}{
		{"api-gateway", "/elsewhere", true},      // title matches
		{"Website", "/srv/repos/web/site", true}, // root matches, '*' crosses '/'
		{"user-docs", "", true},                  // set + star
		{"_internal-docs", "/home/x", false},     // negated set
		{"web", "/home/me/web", false},           // nothing matches
		{"API-gateway", "/home/me/API", false},   // case-sensitive
		{"", "", false},                          // empty matches none of these patterns
		{"x", "/srv/repos/", true},               // '*' matches the empty run
		{"api-", "", true},                       // likewise in the title
		{"notapi-x", "/srv/reposX/a", false},     // anchored at both ends
		{"ok", "/srv/repos/a/b/c/d/e/f/g", true}, // any depth
		{"ok-docs", "/srv/repos-other/x", true},  // title matches via [!_]
		{"bad", "/srv/repos", false},             // no trailing slash
		{"malformed", "", false},                 // sanity
		{"a-docs", "/no", true},                  // one char before -docs
		{"-docs", "/no", false},                  // [!_] needs one character
		{"\u00e9t\u00e9-docs", "/no", true},      // runes, not bytes
		{"api-\xff", "/no", true},                // invalid UTF-8 does not panic
		{"plain", "/srv/repos/\xff\xfe", true},   // nor in the root
		{"x", "/srv/repos/with space/and\ttab", true},
	}
	for _, tc := range cases {
		if got := m.Allows(tc.title, tc.root); got != tc.want {
			t.Errorf("Allows(%q, %q) = %v, want %v", tc.title, tc.root, got, tc.want)
		}
	}
	bad := Machine{Projects: []string{"[abc", "ok"}}
	if bad.Allows("[abc", "") {
		t.Error("a malformed pattern must match nothing")
	}
	if !bad.Allows("ok", "") {
		t.Error("a malformed pattern must not stop the others")
	}
}
