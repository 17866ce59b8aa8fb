// Package demo is the built-in demo machine the binary serves when it finds no
// config: a fake T3 server (internal/t3fake) on a loopback port with a project
// "demo" whose runs are scripted by a word in the prompt, and a state
// directory of its own that is removed when the demo closes, so demo threads
// never reach the user's real state.
//
// Only the command layer uses it; the production assembly (internal/app) is
// handed the demo's config and token like any other machine's.
package demo

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// Name is the demo machine's name in t3_machines.
const Name = "demo"

// Demo is a running demo machine and its temporary state directory.
type Demo struct {
	fake     *t3fake.Server
	stateDir string
}

// Start starts the fake T3 server and creates the demo's state directory
// (under the system's temporary directory).
func Start() (*Demo, error) {
	dir, err := os.MkdirTemp("", "t3code-mcp-demo-")
	if err != nil {
		return nil, fmt.Errorf("demo state directory: %w", err)
	}
	fk, err := t3fake.New(t3fake.Options{Label: Name, StepDelay: 300 * time.Millisecond})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	fk.AddProject("demo", "/srv/demo")
	return &Demo{fake: fk, stateDir: dir}, nil
}

// URL is where the fake T3 server listens.
func (d *Demo) URL() string { return d.fake.URL() }

// StateDir is the demo's own state directory; Close removes it.
func (d *Demo) StateDir() string { return d.stateDir }

// Config is a config with the one demo machine.
func (d *Demo) Config() *config.Config {
	return &config.Config{Path: "(built-in demo)", Machines: []config.Machine{{
		Name: Name, URL: d.fake.URL(), Projects: []string{"*"}, Access: config.AccessOperate,
	}}}
}

// Tokens hands the demo machine's token to the fleet directly (it is random
// per start and never leaves the process).
func (d *Demo) Tokens() map[string]string { return map[string]string{Name: d.fake.Token()} }

// Machines marks the demo machine as such for t3_machines and /healthz.
func (d *Demo) Machines() map[string]bool { return map[string]bool{Name: true} }

// Close stops the fake server and removes the state directory. Call it after
// the connector using that directory has closed its store.
func (d *Demo) Close() error {
	d.fake.Close()
	return os.RemoveAll(d.stateDir)
}

// Help describes the scripted runs.
func Help() string {
	var b strings.Builder
	b.WriteString("demo machine: project \"demo\"; the prompt picks the run:\n")
	for _, sc := range t3fake.Scripts {
		words := "(any other prompt)"
		if len(sc.Words) > 0 {
			words = "a word starting with " + strings.Join(sc.Words, " or ")
		}
		fmt.Fprintf(&b, "  %-8s %s\n", sc.Name, words)
	}
	return b.String()
}
