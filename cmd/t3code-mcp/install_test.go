package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `go install github.com/t3code-mcp/t3code-mcp/cmd/t3code-mcp@latest` is the
// documented install path. Here it runs from the local module into an empty
// GOBIN, and the installed binary answers --version. `go install …@version`
// refuses a module whose go.mod has replace or exclude directives, so there
// must be none.
func TestGoInstall(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(mod), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "replace" || f[0] == "exclude") {
			t.Errorf("go.mod has %q: `go install …@latest` would refuse the module", line)
		}
	}
	gobin := t.TempDir()
	cmd := exec.Command("go", "install", ".")
	cmd.Env = append(os.Environ(), "GOBIN="+gobin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(gobin, "t3code-mcp"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "t3code-mcp ") {
		t.Fatalf("installed binary --version: %q, %v", out, err)
	}
}
