package t3

import (
	"context"
	"encoding/json"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// Reads over the socket that have no HTTP route (fixtures 22, 23).

// ArchivedShell calls orchestration.getArchivedShellSnapshot: the archived
// threads (in Threads) and every project.
func (c *Client) ArchivedShell(ctx context.Context, conn *effectrpc.Conn) (*t3rpc.ShellSnapshot, error) {
	var snap t3rpc.ShellSnapshot
	if err := conn.Call(ctx, "orchestration.getArchivedShellSnapshot", json.RawMessage(`{}`), &snap); err != nil {
		return nil, rpcError(c.name, "orchestration.getArchivedShellSnapshot", err, c.errs.scrub)
	}
	return &snap, nil
}

// SearchThreads calls orchestration.searchThreads: threads (not archived)
// whose message text contains query (at least 2 characters); limit 1–50.
func (c *Client) SearchThreads(ctx context.Context, conn *effectrpc.Conn, query string, limit int) ([]t3rpc.ThreadSearchMatch, error) {
	in := t3rpc.SearchThreadsInput{Query: query, Limit: t3rpc.NewOptInt(limit)}
	var res t3rpc.SearchThreadsResult
	if err := conn.Call(ctx, "orchestration.searchThreads", &in, &res); err != nil {
		return nil, rpcError(c.name, "orchestration.searchThreads", err, c.errs.scrub)
	}
	return res.Matches, nil
}

// TurnDiff calls orchestration.getTurnDiff: the git diff from checkpoint
// from to checkpoint to (turn n ends run n).
func (c *Client) TurnDiff(ctx context.Context, conn *effectrpc.Conn, threadID string, from, to int64) (string, error) {
	in := t3rpc.TurnDiffInput{ThreadId: threadID, FromTurnCount: from, ToTurnCount: to}
	var res t3rpc.TurnDiffResult
	if err := conn.Call(ctx, "orchestration.getTurnDiff", &in, &res); err != nil {
		return "", rpcError(c.name, "orchestration.getTurnDiff", err, c.errs.scrub)
	}
	return res.Diff, nil
}
