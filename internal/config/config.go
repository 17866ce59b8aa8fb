// Package config reads and validates t3code.toml: the T3 machines the connector may use, how to
// authenticate to each (the name of an environment variable, never the token), which projects
// agents may touch (fnmatch allowlists), and per-machine defaults and policy.
//
// Every error names the file, the machine and the key, because the person reading it is an
// operator with the file open in an editor.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// Access levels for a machine.
const (
	AccessOperate = "operate" // read threads and send commands (the default)
	AccessRead    = "read"    // read only: every command tool is refused
)

// Actions that can be made to require a human approval with `approve`.
const (
	ApproveDispatch  = "dispatch"
	ApproveInterrupt = "interrupt"
	ApproveAnswer    = "answer"
)

// approvable lists every value `approve` accepts.
var approvable = []string{ApproveDispatch, ApproveInterrupt, ApproveAnswer}

// What a machine's answers may be compressed with (`compression`).
const (
	CompressionAuto = "auto" // uncompressed from a loopback host, gzip otherwise (the default)
	CompressionGzip = "gzip" // gzip, whatever the host (a loopback URL tunnelled to a distant machine)
	CompressionNone = "none" // uncompressed, whatever the host (a fast network)
)

// compressions lists every value `compression` accepts.
var compressions = []string{CompressionAuto, CompressionGzip, CompressionNone}

// defaultProjects is the allowlist of a machine that has no `projects` key: every project. An
// explicit `projects = []` allows none (a machine kept for status only).
var defaultProjects = []string{"*"}

// Config is a parsed and validated t3code.toml.
type Config struct {
	Path     string    // the file it came from, for messages
	Machines []Machine // sorted by Name
}

// Machine is one `[machines.NAME]` table.
type Machine struct {
	Name     string
	URL      string         // http(s)://host:port of `t3 serve`, without a trailing slash
	TokenEnv string         // name of the environment variable holding the bearer token
	Projects []string       // fnmatch patterns matched against a project's title or workspace root
	Model    string         // "instanceId/model", or "" for T3's own default
	Options  map[string]any // model options; each value is a string or a bool
	Access   string         // AccessOperate or AccessRead
	Approve  []string       // subset of approvable, in file order, without duplicates
	// Compression is one of compressions; "" (no key) is CompressionAuto.
	Compression string
}

// Machine returns the machine with the given name.
func (c *Config) Machine(name string) (Machine, bool) {
	i, ok := slices.BinarySearchFunc(c.Machines, name, func(m Machine, n string) int {
		return strings.Compare(m.Name, n)
	})
	if !ok {
		return Machine{}, false
	}
	return c.Machines[i], true
}

// Token reads the machine's bearer token from the environment. The error names the variable and
// the machine, never a value.
func (m Machine) Token() (string, error) {
	v, ok := os.LookupEnv(m.TokenEnv)
	if !ok {
		return "", fmt.Errorf("machine %q: environment variable %s (token_env) is not set", m.Name, m.TokenEnv)
	}
	if strings.TrimSpace(v) == "" {
		return "", fmt.Errorf("machine %q: environment variable %s (token_env) is empty", m.Name, m.TokenEnv)
	}
	return v, nil
}

// ModelSelection splits Model into T3's provider instance id and model name. ok is false when the
// machine names no model (T3 then picks its default).
func (m Machine) ModelSelection() (instanceID, model string, ok bool) {
	instanceID, model, ok = strings.Cut(m.Model, "/")
	if !ok || instanceID == "" || model == "" {
		return "", "", false
	}
	return instanceID, model, true
}

// Allows reports whether a project may be used on this machine: any pattern matches its title or
// its workspace root. Patterns were validated when the file was parsed, so a Machine from Parse
// never hits a malformed one; a hand-built Machine's malformed pattern simply matches nothing.
func (m Machine) Allows(title, workspaceRoot string) bool {
	for _, p := range m.Projects {
		c, err := compile(p)
		if err != nil {
			continue
		}
		if c.match(title) || c.match(workspaceRoot) {
			return true
		}
	}
	return false
}

// ReadOnly reports whether the machine refuses every command.
func (m Machine) ReadOnly() bool { return m.Access == AccessRead }

// Approves reports whether action needs a human approval on this machine.
func (m Machine) Approves(action string) bool { return slices.Contains(m.Approve, action) }

// Load reads and parses the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The *PathError already names the file.
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return Parse(data, path)
}

var (
	machineNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	envNameRe     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// knownMachineKeys are the keys of a [machines.NAME] table, in the order messages list them: the
// fields of MachineTable, which the JSON Schema for editors is made from.
var knownMachineKeys = tableKeys(reflect.TypeFor[MachineTable]())

// Parse parses and validates the contents of a t3code.toml; path is only used in messages.
//
// The file is decoded into generic maps and checked key by key instead of into a typed struct:
// that way every error, including a wrong value type, can name the machine and the key in the
// operator's terms rather than a Go type, and unknown keys are found by comparing against the
// known set (what toml.MetaData.Undecoded would report, with the machine attached).
func Parse(data []byte, path string) (*Config, error) {
	if path == "" {
		path = "t3code.toml"
	}
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s: line %d: %s", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	cfg := &Config{Path: path}
	for _, k := range sortedKeys(raw) {
		if k != "machines" {
			return nil, fmt.Errorf("%s: unknown key %q (the file holds only [machines.NAME] tables)", path, k)
		}
	}
	if v, ok := raw["machines"]; ok {
		tables, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: key \"machines\" must be tables like [machines.mac], got %s", path, typeName(v))
		}
		for _, name := range sortedKeys(tables) {
			m, err := parseMachine(name, tables[name])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			cfg.Machines = append(cfg.Machines, m)
		}
	}
	return cfg, nil
}

func parseMachine(name string, v any) (Machine, error) {
	m := Machine{Name: name, Access: AccessOperate}
	if !machineNameRe.MatchString(name) {
		return m, fmt.Errorf("machine %q: the name must start with a letter or digit and hold only letters, digits, '_', '.' and '-'", name)
	}
	t, ok := v.(map[string]any)
	if !ok {
		return m, fmt.Errorf("machine %q: must be a table like [machines.%s], got %s", name, name, typeName(v))
	}
	keyErr := func(key, format string, args ...any) error {
		return fmt.Errorf("machine %q: key %q: %s", name, key, fmt.Sprintf(format, args...))
	}
	for _, k := range sortedKeys(t) {
		if k == "token" {
			// The value is deliberately not echoed: it is a credential.
			return m, keyErr(k, "tokens never go in the config file; put the token in an environment variable and name that variable with token_env")
		}
		if !slices.Contains(knownMachineKeys, k) {
			return m, fmt.Errorf("machine %q: unknown key %q (known keys: %s)", name, k, strings.Join(knownMachineKeys, ", "))
		}
	}
	// One parser per key, in the order the file's keys are documented; the first error wins.
	for _, parse := range []keyParser{parseURL, parseTokenEnv, parseProjects, parseModel, parseOptions, parseAccess, parseApprove, parseCompression} {
		if err := parse(&m, t, keyErr); err != nil {
			return m, err
		}
	}
	return m, nil
}

// keyErrorf makes an error naming the machine and the key.
type keyErrorf func(key, format string, args ...any) error

// A keyParser checks one key of a [machines.NAME] table and sets it on m.
type keyParser func(m *Machine, t map[string]any, keyErr keyErrorf) error

func parseURL(m *Machine, t map[string]any, keyErr keyErrorf) error {
	u, present, err := stringKey(t, "url")
	if err != nil {
		return keyErr("url", "%v", err)
	}
	if !present || u == "" {
		return keyErr("url", "is required, e.g. url = \"http://100.64.0.7:3773\"")
	}
	if err := checkURL(u); err != nil {
		return keyErr("url", "%v", err)
	}
	m.URL = strings.TrimRight(u, "/")
	return nil
}

func parseTokenEnv(m *Machine, t map[string]any, keyErr keyErrorf) error {
	te, present, err := stringKey(t, "token_env")
	if err != nil {
		return keyErr("token_env", "%v", err)
	}
	if !present || te == "" {
		return keyErr("token_env", "is required: the name of the environment variable that holds this machine's token, e.g. token_env = \"T3_%s_TOKEN\"", envSuggestion(m.Name))
	}
	if !envNameRe.MatchString(te) {
		return keyErr("token_env", "%q is not an environment variable name (letters, digits and '_', not starting with a digit)", te)
	}
	m.TokenEnv = te
	return nil
}

func parseProjects(m *Machine, t map[string]any, keyErr keyErrorf) error {
	pv, ok := t["projects"]
	if !ok {
		m.Projects = slices.Clone(defaultProjects)
		return nil
	}
	ps, err := stringList(pv)
	if err != nil {
		return keyErr("projects", "%v", err)
	}
	for _, p := range ps {
		if err := validatePattern(p); err != nil {
			return keyErr("projects", "pattern %q is malformed: %v", p, err)
		}
	}
	m.Projects = ps
	return nil
}

func parseModel(m *Machine, t map[string]any, keyErr keyErrorf) error {
	model, _, err := stringKey(t, "model")
	if err != nil {
		return keyErr("model", "%v", err)
	}
	if model != "" {
		inst, mod, ok := strings.Cut(model, "/")
		if !ok || inst == "" || mod == "" || strings.ContainsAny(model, " \t\r\n") {
			return keyErr("model", "%q is not instanceId/model, e.g. \"claudeAgent/claude-opus-5\"", model)
		}
		m.Model = model
	}
	return nil
}

func parseOptions(m *Machine, t map[string]any, keyErr keyErrorf) error {
	ov, ok := t["options"]
	if !ok {
		return nil
	}
	tbl, ok := ov.(map[string]any)
	if !ok {
		return keyErr("options", "must be a table like { effort = \"high\" }, got %s", typeName(ov))
	}
	m.Options = make(map[string]any, len(tbl))
	for _, k := range sortedKeys(tbl) {
		switch val := tbl[k].(type) {
		case string, bool:
			m.Options[k] = val
		default:
			return keyErr("options."+k, "must be a string or a boolean, got %s", typeName(val))
		}
	}
	return nil
}

func parseAccess(m *Machine, t map[string]any, keyErr keyErrorf) error {
	acc, present, err := stringKey(t, "access")
	if err != nil {
		return keyErr("access", "%v", err)
	}
	if present {
		if acc != AccessOperate && acc != AccessRead {
			return keyErr("access", "%q is not one of %q, %q", acc, AccessOperate, AccessRead)
		}
		m.Access = acc
	}
	return nil
}

func parseApprove(m *Machine, t map[string]any, keyErr keyErrorf) error {
	av, ok := t["approve"]
	if !ok {
		return nil
	}
	as, err := stringList(av)
	if err != nil {
		return keyErr("approve", "%v", err)
	}
	for _, a := range as {
		if !slices.Contains(approvable, a) {
			return keyErr("approve", "%q is not one of %s", a, text.QuoteList(approvable))
		}
		if !slices.Contains(m.Approve, a) {
			m.Approve = append(m.Approve, a)
		}
	}
	return nil
}

func parseCompression(m *Machine, t map[string]any, keyErr keyErrorf) error {
	c, present, err := stringKey(t, "compression")
	if err != nil {
		return keyErr("compression", "%v", err)
	}
	m.Compression = CompressionAuto
	if present {
		if !slices.Contains(compressions, c) {
			return keyErr("compression", "%q is not one of %s", c, text.QuoteList(compressions))
		}
		m.Compression = c
	}
	return nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL", s)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q must start with http:// or https://", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", s)
	}
	if u.User != nil {
		// Credentials in the URL would be a token in the file by another name. Not echoed.
		return errors.New("must not contain a user or password; put the token in the environment variable named by token_env")
	}
	return nil
}

func stringKey(t map[string]any, key string) (string, bool, error) {
	v, ok := t[key]
	if !ok {
		return "", false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", true, fmt.Errorf("must be a string, got %s", typeName(v))
	}
	return s, true, nil
}

func stringList(v any) ([]string, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("must be a list of strings, got %s", typeName(v))
	}
	out := make([]string, 0, len(arr))
	for i, e := range arr {
		s, ok := e.(string)
		if !ok {
			return nil, fmt.Errorf("entry %d must be a string, got %s", i+1, typeName(e))
		}
		out = append(out, s)
	}
	return out, nil
}

func typeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case []any, []map[string]any:
		return "a list"
	case map[string]any:
		return "a table"
	default:
		return "a date/time"
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func envSuggestion(name string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(name) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
