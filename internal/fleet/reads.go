package fleet

import (
	"context"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Reads over the machine's socket for t3_threads and t3_thread's diff. Each
// applies the allowlist here, like every other way to a thread.

// Threads lists the machine's active threads in allowlisted projects.
func (m *Machine) Threads() []t3rpc.ThreadShell {
	if m.watcher == nil {
		return nil
	}
	allowed := m.allowedProjects()
	var out []t3rpc.ThreadShell
	for _, t := range m.watcher.Threads() {
		if allowed[t.ProjectId] {
			out = append(out, t)
		}
	}
	return out
}

// ArchivedThreads reads the machine's archived threads in allowlisted
// projects (orchestration.getArchivedShellSnapshot; the watcher keeps only
// active ones).
func (m *Machine) ArchivedThreads(ctx context.Context) ([]t3rpc.ThreadShell, error) {
	if err := m.Ready(); err != nil {
		return nil, err
	}
	conn, err := m.watcher.Conn(ctx)
	if err != nil {
		return nil, err
	}
	snap, err := m.client.ArchivedShell(ctx, conn)
	if err != nil {
		return nil, err
	}
	allowed := m.allowedProjects()
	var out []t3rpc.ThreadShell
	for _, t := range snap.Threads {
		if allowed[t.ProjectId] {
			out = append(out, t)
		}
	}
	return out, nil
}

// SearchThreads asks T3 which threads' messages contain query; matches in
// projects no allowlist admits are dropped.
func (m *Machine) SearchThreads(ctx context.Context, query string, limit int) ([]t3rpc.ThreadSearchMatch, error) {
	if err := m.Ready(); err != nil {
		return nil, err
	}
	conn, err := m.watcher.Conn(ctx)
	if err != nil {
		return nil, err
	}
	matches, err := m.client.SearchThreads(ctx, conn, query, limit)
	if err != nil {
		return nil, err
	}
	allowed := m.allowedProjects()
	out := matches[:0]
	for _, mt := range matches {
		if allowed[mt.ProjectId] {
			out = append(out, mt)
		}
	}
	return out, nil
}

// TurnDiff reads the git diff between two checkpoints of a thread the caller
// already found through Fleet.Thread (so allowlisted).
func (m *Machine) TurnDiff(ctx context.Context, threadID string, from, to int64) (string, error) {
	if err := m.Ready(); err != nil {
		return "", err
	}
	conn, err := m.watcher.Conn(ctx)
	if err != nil {
		return "", err
	}
	return m.client.TurnDiff(ctx, conn, threadID, from, to)
}

func (m *Machine) allowedProjects() map[string]bool {
	out := map[string]bool{}
	for _, p := range m.Projects() {
		out[p.ID] = true
	}
	return out
}
