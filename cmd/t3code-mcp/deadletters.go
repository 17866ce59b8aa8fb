package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/t3code-mcp/t3code-mcp/internal/plural"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

func (c *cli) deadLettersCommand() *cobra.Command {
	list := &cobra.Command{
		Use:   "dead-letters",
		Short: "list events the hook never accepted; \"dead-letters retry [id…]\" requeues them",
		Long: `List the events that could not be delivered (id, thread, when, attempts, last error).
The state file is locked while a connector runs: stop it first.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return c.listDeadLetters() },
	}
	list.AddCommand(&cobra.Command{
		Use:   "retry [id…]",
		Short: "requeue dead letters (all of them when no id is given)",
		Long: `Requeue dead letters, all of them when no id is given; they are delivered when the
connector starts again. The state file is locked while a connector runs: stop it first.`,
		RunE: func(_ *cobra.Command, ids []string) error { return c.retryDeadLetters(ids) },
	})
	return list
}

// openStateStore opens the state file the settings name for a command that
// reads or changes it; a failure is already reported on stderr.
func (c *cli) openStateStore() (store.Store, error) {
	s, err := c.settings()
	if err != nil {
		return nil, err
	}
	st, err := openStore(s)
	if err != nil {
		fmt.Fprintln(c.stderr, "t3code-mcp:", err)
		return nil, exitFailed
	}
	return st, nil
}

func (c *cli) listDeadLetters() error {
	st, err := c.openStateStore()
	if err != nil {
		return err
	}
	defer st.Close()
	dead, err := st.Dead()
	if err != nil {
		fmt.Fprintln(c.stderr, "t3code-mcp:", err)
		return exitFailed
	}
	for _, e := range dead {
		fmt.Fprintf(c.stdout, "%s\t%s\t%s\tattempts=%d\t%s\n", e.ID, e.Stream, e.DeadAt.Format(time.RFC3339), e.Attempts, strings.ReplaceAll(e.LastError, "\n", " "))
	}
	fmt.Fprintln(c.stdout, plural.Count(len(dead), "dead letter"))
	return nil
}

func (c *cli) retryDeadLetters(ids []string) error {
	st, err := c.openStateStore()
	if err != nil {
		return err
	}
	defer st.Close()
	n, err := st.Requeue(time.Now(), ids...)
	if err != nil {
		fmt.Fprintln(c.stderr, "t3code-mcp:", err)
		return exitFailed
	}
	fmt.Fprintf(c.stdout, "requeued %s; the connector delivers them when it starts again\n", plural.Count(n, "dead letter"))
	return nil
}
