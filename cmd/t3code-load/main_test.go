package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/loadtest"
)

// The flags override the profile's figures they name, and only those.
func TestFlagsOverrideTheProfile(t *testing.T) {
	o, err := parse([]string{"-short", "-q", "-m", "3", "-e", "7.5", "-drain", "9s", "-script", "fail", "-phases", "latency,outage",
		"-poll", "2s:5", "-thread-items", "-1", "-thread-first", "3", "-replicas", "1", "-no-hook", "-lockstep", "-compression", "gzip",
		"-thread-control-plane=false", "-replica-env", "T3CODE_MCP_LEASE_TTL=1500ms", "-replica-env", "T3CODE_MCP_CLAIM_TTL=10s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := o.config(io.Discard)
	want := loadtest.Short()
	want.Machines, want.Rate, want.Drain, want.Script = 3, 7.5, 9*time.Second, "fail"
	want.Phases = []string{"latency", "outage"}
	want.Pollers, _ = loadtest.ParsePollers("2s:5")
	want.BigThreadItems, want.ThreadFirst, want.Replicas, want.NoHook, want.Compression = -1, 3, 1, true, "gzip"
	want.ThreadControlPlane = false // on in the profile
	want.LockStep = true
	want.ReplicaEnv = []string{"T3CODE_MCP_LEASE_TTL=1500ms", "T3CODE_MCP_CLAIM_TTL=10s"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("config\n got %+v\nwant %+v", got, want)
	}

	o, err = parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got = o.config(io.Discard)
	want = loadtest.Full()
	want.Replicas, want.Progress = 1, io.Discard
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("no flags: config\n got %+v\nwant %+v", got, want)
	}
}

// -replicas without a database, a malformed -poll and a -replica-env that is no KEY=VALUE or
// names the listen address are refused before anything runs.
func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{{"-replicas", "2"}, {"-poll", "bogus"}, {"-m", "x"}, {"-replica-env", "T3CODE_MCP_CLAIM_TTL"},
		{"-replica-env", "=1"}, {"-replica-env", "T3CODE_MCP_PORT=9"}, {"-trace", "t.out", "-trace-phase", "bogus"},
		{"-harness-trace"}} {
		if _, err := parse(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
		if rc := run(args, io.Discard, io.Discard); rc != 2 {
			t.Errorf("%v: exit %d, want 2", args, rc)
		}
	}
}

// -trace writes a runtime/trace of a window of its phase, begun -trace-after into it and ended
// with the phase at the latest; it implies the connector in this process.
func TestTraceCoversAWindowOfItsPhase(t *testing.T) {
	out := filepath.Join(t.TempDir(), "trace.out")
	o, err := parse([]string{"-trace", out, "-trace-phase", "latency", "-trace-after", "0s", "-trace-for", "1h"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.config(io.Discard)
	if !cfg.InProcess {
		t.Fatal("-trace did not run the connector in process")
	}
	stop, err := o.startProfiles(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cfg.OnPhase("thread", true) // another phase: no window
	cfg.OnPhase("thread", false)
	cfg.OnPhase("latency", true)
	// The window begins on a timer (-trace-after 0): wait for the trace's header.
	for {
		if st, err := os.Stat(out); err == nil && st.Size() > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cfg.OnPhase("latency", false) // the phase's end ends the window
	stop()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("go 1.")) {
		t.Fatalf("not a runtime/trace: %q", b[:min(len(b), 16)])
	}
}

// -harness-trace keeps the connector the binary: the trace (taken by the same window as -trace's,
// TestTraceCoversAWindowOfItsPhase) is of the harness process alone.
func TestHarnessTraceKeepsTheConnectorTheBinary(t *testing.T) {
	o, err := parse([]string{"-trace", filepath.Join(t.TempDir(), "trace.out"), "-harness-trace"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := o.config(io.Discard); cfg.InProcess {
		t.Fatal("-harness-trace ran the connector in process")
	}
}

// A phase that ends before -trace-after leaves no trace.
func TestTraceWindowNotBegunWhenThePhaseEndsFirst(t *testing.T) {
	out := filepath.Join(t.TempDir(), "trace.out")
	o, err := parse([]string{"-trace", out, "-trace-after", "1h"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.config(io.Discard)
	stop, err := o.startProfiles(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.OnPhase("latency", true)
	cfg.OnPhase("latency", false)
	stop()
	if st, err := os.Stat(out); err != nil || st.Size() != 0 {
		t.Fatalf("trace file: %v, %v; want empty", st, err)
	}
}

// -split runs this executable's hidden subcommand as the second process; with -trace it is off
// (the trace's marks must be in the traced process).
func TestSplitRunsTheClientsSubcommand(t *testing.T) {
	o, err := parse([]string{"-split"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	if got := o.config(io.Discard).Split; !reflect.DeepEqual(got, []string{exe, clientsCommand}) {
		t.Fatalf("-split: %v", got)
	}
	o, err = parse([]string{"-split", "-trace", filepath.Join(t.TempDir(), "trace.out"), "-harness-trace"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var msg strings.Builder
	if got := o.config(&msg).Split; got != nil {
		t.Fatalf("-split with -trace: %v", got)
	}
	if !strings.Contains(msg.String(), "-split: off with -trace") {
		t.Fatalf("-split with -trace: nothing said on stderr (%q)", msg.String())
	}
}
