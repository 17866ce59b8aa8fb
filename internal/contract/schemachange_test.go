package contract

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nestedEnv is set for the contract tests that TestSchemaChangeIsCaught runs in its scratch copy,
// so that they do not start another copy.
const nestedEnv = "T3CODE_MCP_SCHEMA_CHANGE_COPY"

// TestSchemaChangeIsCaught proves that a schema change which breaks decoding is caught when the
// code is generated and the contract tests run, not later at run time: in a scratch copy of the
// module it renames a required field of T3's read model (ThreadShell "status" → "state"), runs
// `go generate ./tools.go` and the contract tests there, and expects them to fail on the recorded
// frames that still say "status".
func TestSchemaChangeIsCaught(t *testing.T) {
	if os.Getenv(nestedEnv) != "" {
		t.Skip("running inside the scratch copy of TestSchemaChangeIsCaught")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to regenerate code: %v", err)
	}
	root := filepath.Join("..", "..")
	tmp := t.TempDir()
	// What `go generate ./tools.go` runs (the generators and the config package whose types make
	// the config schema) and what the contract tests read.
	for _, p := range []string{"go.mod", "go.sum", "tools.go", "schema", "internal/generators", "internal/config", "internal/text", "internal/contract", "testdata/t3", "docs/events.md"} {
		copyTree(t, filepath.Join(root, p), filepath.Join(tmp, p))
	}

	model := filepath.Join(tmp, "schema", "t3", "model.json")
	renameRequiredField(t, model, "ThreadShell", "status", "state")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	run := func(env []string, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), append([]string{"GOWORK=off"}, env...)...)
		return cmd.CombinedOutput()
	}
	if out, err := run(nil, "generate", "./tools.go"); err != nil {
		t.Fatalf("go generate in the scratch copy: %v\n%s", err, out)
	}
	gen, err := os.ReadFile(filepath.Join(tmp, "gen", "t3rpc", "rpc_gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(gen, []byte("State string `json:\"state\"`")) {
		t.Fatalf("the renamed field did not reach gen/t3rpc: the scratch copy did not regenerate")
	}
	t.Logf("regenerated in %s", time.Since(start).Round(time.Second))

	out, err := run([]string{nestedEnv + "=1"}, "test", "-count=1", "./internal/contract/")
	t.Logf("contract tests in the scratch copy ran in %s", time.Since(start).Round(time.Second))
	if err == nil {
		t.Fatalf("the contract tests passed after a required field of ThreadShell was renamed; they must fail:\n%s", out)
	}
	if ctx.Err() != nil {
		t.Fatalf("timed out: %v\n%s", ctx.Err(), out)
	}
	// They must fail because recorded data no longer decodes, not for an unrelated reason.
	for _, want := range []string{"--- FAIL: TestRecordedHTTPBodiesDecode", "--- FAIL: TestRecordedFramesDecode", "state (field required)"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the scratch copy's contract tests failed, but the output lacks %q:\n%s", want, tail(out, 4000))
		}
	}
	t.Logf("as expected, the scratch copy's contract tests failed; the start of their output:\n%s", head(out, 1500))
	// ... and only the tests that read T3's data fail.
	for _, unrelated := range []string{"--- FAIL: TestToolSchemas", "--- FAIL: TestEvent"} {
		if bytes.Contains(out, []byte(unrelated)) {
			t.Errorf("the scratch copy's contract tests failed for an unrelated reason (%s):\n%s", unrelated, tail(out, 4000))
		}
	}
}

// renameRequiredField renames property from → to in $defs/def of a JSON Schema file, in its
// properties and its required list.
func renameRequiredField(t *testing.T, path, def, from, to string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	defs, _ := doc["$defs"].(map[string]any)
	d, _ := defs[def].(map[string]any)
	props, _ := d["properties"].(map[string]any)
	if props == nil || props[from] == nil {
		t.Fatalf("%s: no property %s in $defs/%s", path, from, def)
	}
	props[to] = props[from]
	delete(props, from)
	req, _ := d["required"].([]any)
	found := false
	for i, r := range req {
		if r == from {
			req[i], found = to, true
		}
	}
	if !found {
		t.Fatalf("%s: %s is not required in $defs/%s", path, from, def)
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies a file or a directory tree.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}

func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return "…" + strings.TrimLeft(string(b[len(b)-n:]), "\n")
}

func head(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
