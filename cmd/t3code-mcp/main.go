// Command t3code-mcp is an MCP server that runs coding threads on T3 Code
// machines. Subcommands:
//
//	t3code-mcp [serve]            MCP over streamable HTTP at /mcp (default)
//	t3code-mcp stdio              the same tools over stdio, for local clients
//	t3code-mcp doctor             check the config, machines, tokens and hook
//	t3code-mcp dead-letters       list undeliverable events; `retry [id…]` requeues them
//	t3code-mcp audit              print the audit log of mutating calls
//	t3code-mcp healthcheck        exit 0 when the local serve answers /healthz (container HEALTHCHECK)
//	t3code-mcp config-schema      print the JSON Schema of t3code.toml (editor completion and checks)
//	t3code-mcp version
//
// Settings come from the environment or from the flags that mirror it
// (docs/configuration.md); a flag wins over its variable.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
)

// version is stamped at build time (`make build`, the Dockerfile):
// -ldflags "-X main.version=$(git describe --tags --always --dirty)".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Version is the stamped version; an unstamped binary that `go install
// …@vX` built reports the module version instead of "dev".
func Version() string {
	if version != "dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

// exitCode ends a command with a code; whatever it had to say is printed.
type exitCode int

func (e exitCode) Error() string { return "exit " + strconv.Itoa(int(e)) }

// Exit codes: 0 fine, 1 the command failed, 2 the command line or a setting
// is wrong.
const (
	exitFailed = exitCode(1)
	exitUsage  = exitCode(2)
)

// settingFlags are the flags that mirror an environment variable: a flag
// given on the command line wins over its variable.
var settingFlags = []struct{ flag, env string }{
	{"config", "T3CODE_MCP_CONFIG"},
	{"host", "T3CODE_MCP_HOST"},
	{"port", "T3CODE_MCP_PORT"},
	{"state-dir", "T3CODE_MCP_STATE_DIR"},
	{"database-url", "T3CODE_MCP_DATABASE_URL"},
	{"claim-ttl", "T3CODE_MCP_CLAIM_TTL"},
	{"log-level", "T3CODE_MCP_LOG_LEVEL"},
	{"read-only", "T3CODE_MCP_READ_ONLY"},
}

// cli is one run of the command line: its output streams, the parsed flags
// and the logger the persistent flags chose.
type cli struct {
	stdout, stderr io.Writer
	flags          *pflag.FlagSet // the root's persistent flags
	log            *slog.Logger
}

// getenv reads a setting: the mirroring flag when it was given, else the
// environment.
func (c *cli) getenv(key string) string {
	if key == "T3CODE_MCP_LOG_FORMAT" {
		if f := c.flags.Lookup("log-json"); f != nil && f.Changed {
			if f.Value.String() == "true" {
				return "json"
			}
			return "text"
		}
	}
	for _, m := range settingFlags {
		if m.env == key {
			if f := c.flags.Lookup(m.flag); f != nil && f.Changed {
				return f.Value.String()
			}
		}
	}
	return os.Getenv(key)
}

// settings reads the settings; a bad value is reported on stderr.
func (c *cli) settings() (app.Settings, error) {
	s, err := app.SettingsFromEnv(c.getenv)
	if err != nil {
		fmt.Fprintln(c.stderr, "configuration error:", err)
		return s, exitUsage
	}
	return s, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &cli{stdout: stdout, stderr: stderr}
	root := c.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	default:
		// cobra's own: an unknown command or flag, a wrong argument count.
		fmt.Fprintf(stderr, "t3code-mcp: %v\nRun 't3code-mcp --help' for usage.\n", err)
		return int(exitUsage)
	}
}

func (c *cli) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "t3code-mcp",
		Short: "Run coding threads on T3 Code machines over MCP",
		Long: `t3code-mcp is an MCP server that lets AI agents run coding threads on machines that run
T3 Code (t3 serve). With no command it serves MCP over streamable HTTP (like "serve").

Machines come from T3CODE_MCP_CONFIG (--config), else ./t3code.toml, else the built-in demo
machine. Every setting is an environment variable; the flags below mirror the common ones and
win over them. All of them: docs/configuration.md.`,
		Version:           Version(),
		Args:              cobra.NoArgs,
		SilenceErrors:     true,
		SilenceUsage:      true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return c.setupLog() },
		RunE:              func(cmd *cobra.Command, _ []string) error { return c.serve(cmd.Context()) },
	}
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetVersionTemplate("t3code-mcp {{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	})
	pf := root.PersistentFlags()
	pf.String("config", "", "machines file t3code.toml (T3CODE_MCP_CONFIG; default ./t3code.toml, else the demo machine)")
	pf.String("host", "", "listen address of serve (T3CODE_MCP_HOST; default 127.0.0.1)")
	pf.Int("port", 0, "listen port of serve (T3CODE_MCP_PORT; default 8000)")
	pf.String("state-dir", "", "state directory (T3CODE_MCP_STATE_DIR; default $XDG_STATE_HOME/t3code-mcp)")
	pf.String("database-url", "", "keep the state in PostgreSQL, shared by replicas: postgres://user:password@host:port/db (T3CODE_MCP_DATABASE_URL; default the bbolt file in the state directory)")
	pf.String("claim-ttl", "", "with PostgreSQL: how long a replica's claim on an event it delivers lasts unless renewed; a dead replica's events are taken over after it (T3CODE_MCP_CLAIM_TTL; default 30s)")
	pf.String("log-level", "", "debug, info, warn or error (T3CODE_MCP_LOG_LEVEL; default info)")
	pf.Bool("log-json", false, "log JSON lines instead of text (T3CODE_MCP_LOG_FORMAT=json)")
	pf.Bool("read-only", false, "offer only the read tools; t3_dispatch, t3_answer and t3_interrupt are not listed (T3CODE_MCP_READ_ONLY)")
	c.flags = pf

	root.AddCommand(
		&cobra.Command{
			Use:   "serve",
			Short: "MCP over streamable HTTP at /mcp (the default)",
			Long: `Serve MCP over streamable HTTP at http://HOST:PORT/mcp, with /healthz and /metrics beside it.
Without a config it serves the built-in demo machine, whose state lives in a temporary
directory removed at exit.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return c.serve(cmd.Context()) },
		},
		&cobra.Command{
			Use:   "stdio",
			Short: "the same tools over stdin/stdout, for clients that start their own server",
			Long: `Serve MCP over stdin/stdout: the client starts this process (for example
"claude mcp add t3code -- t3code-mcp stdio"). Logs go to stderr.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return c.stdio(cmd.Context()) },
		},
		&cobra.Command{
			Use:   "doctor",
			Short: "check the settings, the config, each machine, the hook, the listen address and the state file",
			Long: `Check everything serve needs, one ok / warn / FAIL line per check, without changing anything.
Exits 1 on any FAIL, 0 otherwise (warnings allowed).`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return c.doctor(cmd.Context()) },
		},
		c.deadLettersCommand(),
		c.migrateStoreCommand(),
		c.auditCommand(),
		c.configSchemaCommand(),
		&cobra.Command{
			Use:   "healthcheck",
			Short: "exit 0 when the serve on T3CODE_MCP_HOST/T3CODE_MCP_PORT answers /healthz (container HEALTHCHECK)",
			Args:  cobra.NoArgs,
			RunE:  func(cmd *cobra.Command, _ []string) error { return c.healthcheck(cmd.Context()) },
		},
		&cobra.Command{
			Use:   "version",
			Short: "print the version",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				fmt.Fprintln(c.stdout, "t3code-mcp", Version())
				return nil
			},
		},
	)
	return root
}

// setupLog makes the logger the flags and variables ask for. Logs go to
// stderr always: stdout is the MCP channel under stdio.
func (c *cli) setupLog() error {
	name := c.getenv("T3CODE_MCP_LOG_LEVEL")
	if name == "" {
		name = "info"
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(name)); err != nil {
		fmt.Fprintf(c.stderr, "--log-level / T3CODE_MCP_LOG_LEVEL %q: want debug, info, warn or error\n", name)
		return exitUsage
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(c.stderr, opts)
	if c.getenv("T3CODE_MCP_LOG_FORMAT") == "json" {
		h = slog.NewJSONHandler(c.stderr, opts)
	}
	c.log = slog.New(h)
	slog.SetDefault(c.log)
	return nil
}
