package t3fake

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// The read RPCs behind t3_threads and t3_thread's diff, as recorded in fixtures 22 and 23:
// orchestration.getArchivedShellSnapshot, orchestration.searchThreads,
// orchestration.getTurnDiff and orchestration.getFullThreadDiff.

// readRPC answers the read RPCs of this file; ok is false for any other method.
func (s *Server) readRPC(method string, payload jx.Raw, scopes []string) (result, bool) {
	switch method {
	case "orchestration.getArchivedShellSnapshot", "orchestration.searchThreads",
		"orchestration.getTurnDiff", "orchestration.getFullThreadDiff":
	default:
		return result{}, false
	}
	if !hasScope(scopes, ScopeRead) {
		return failed(missingScope(ScopeRead)), true
	}
	switch method {
	case "orchestration.getArchivedShellSnapshot":
		return s.archivedShell(), true
	case "orchestration.searchThreads":
		return s.searchThreads(payload), true
	case "orchestration.getTurnDiff":
		var in t3rpc.TurnDiffInput
		if err := decodePayload(payload, &in); err != nil {
			return died(decodeDefect(err)), true
		}
		return s.turnDiff("OrchestrationGetTurnDiffError", "Failed to load turn diff", in.ThreadId, in.FromTurnCount, in.ToTurnCount), true
	default:
		var in t3rpc.FullThreadDiffInput
		if err := decodePayload(payload, &in); err != nil {
			return died(decodeDefect(err)), true
		}
		return s.turnDiff("OrchestrationGetFullThreadDiffError", "Failed to load full thread diff", in.ThreadId, 0, in.ToTurnCount), true
	}
}

// archivedShell is getArchivedShellSnapshot: the shell snapshot's shape with only the archived
// threads, as "threads" (recorded, 23).
func (s *Server) archivedShell() result {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.shellSnapshot()
	out := t3rpc.ShellSnapshot{
		SchemaVersion:    snap.SchemaVersion,
		SnapshotSequence: snap.SnapshotSequence,
		Projects:         snap.Projects,
		Threads:          snap.ArchivedThreads,
	}
	return ok(&out)
}

// searchThreads matches message text (not titles) of threads that are not archived, one match per
// thread, newest thread first; a query under 2 characters or a limit outside 1–50 is a Die with
// T3's wording (23).
func (s *Server) searchThreads(payload jx.Raw) result {
	var in t3rpc.SearchThreadsInput
	if err := decodePayload(payload, &in); err != nil {
		return died(decodeDefect(err))
	}
	if len([]rune(in.Query)) < 2 {
		return died("Expected a value with a length of at least 2\n  at [\"query\"]")
	}
	limit := 20
	if l, set := in.Limit.Get(); set {
		if l < 1 || l > 50 {
			return died("Expected a value between 1 and 50\n  at [\"limit\"]")
		}
		limit = l
	}
	q := strings.ToLower(in.Query)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := t3rpc.SearchThreadsResult{Matches: []t3rpc.ThreadSearchMatch{}}
	for i := len(s.threads) - 1; i >= 0 && len(out.Matches) < limit; i-- {
		th := s.threads[i]
		if th.archived {
			continue
		}
		for _, m := range th.messages {
			if strings.Contains(strings.ToLower(m.Text), q) {
				out.Matches = append(out.Matches, t3rpc.ThreadSearchMatch{
					ThreadId: th.id, ProjectId: th.shell.ProjectId, Source: optStr(m.Role),
					Snippet: optStr(excerpt(m.Text, 200)), MessageCreatedAt: m.CreatedAt,
				})
				break
			}
		}
	}
	return ok(&out)
}

// turnDiff is getTurnDiff (and getFullThreadDiff, from turn 0) with the recorded build's limits
// (22): turn n is the checkpoint of run n; a range from turn 0 fails once the thread has two turns
// (its turn-0 ref is gone) and is empty before that (first-run changes do not show); past the
// current turn count fails; from > to is a Die.
func (s *Server) turnDiff(tag, msg, threadID string, from, to int64) result {
	if from > to {
		return died("fromTurnCount must be less than or equal to toTurnCount")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(name, cause string) result {
		return failed(&t3rpc.TaggedError{Tag: tag, Message: optStr(msg + ": " + name + ": " + cause)})
	}
	th := s.threadByID[threadID]
	if th == nil {
		return fail("CheckpointThreadNotFoundError", fmt.Sprintf("Checkpoint invariant violation in CheckpointDiffQuery.getTurnDiff: Thread '%s' not found.", threadID))
	}
	turns := map[int64][]t3rpc.ChangedFile{}
	var current int64
	for _, cp := range th.checkpoints {
		_, ord, _ := strings.Cut(cp.ID, ":run:")
		n, err := strconv.ParseInt(ord, 10, 64)
		if err != nil {
			continue
		}
		turns[n] = cp.Files
		current = max(current, n)
	}
	unavailable := func(turn int64) string {
		return fmt.Sprintf("Checkpoint unavailable for thread %s turn %d", threadID, turn)
	}
	if to > current {
		return fail("CheckpointTurnRangeUnavailableError", fmt.Sprintf("%s: Turn diff range exceeds current turn count: requested %d, current %d.", unavailable(to), to, current))
	}
	if from == 0 && to > 0 && current >= 2 {
		return fail("CheckpointRefUnavailableError", unavailable(0)+": Checkpoint ref is unavailable for turn 0.")
	}
	var b strings.Builder
	for n := max(from+1, 2); n <= to; n++ {
		files := append([]t3rpc.ChangedFile(nil), turns[n]...)
		sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
		for _, f := range files {
			writeFileDiff(&b, f, n, int(s.diffLines.Load()))
		}
	}
	return ok(&t3rpc.TurnDiffResult{ThreadId: threadID, FromTurnCount: from, ToTurnCount: to, Diff: b.String()})
}

// writeFileDiff writes a git diff of one changed file: its deletions, then its additions (at
// least lines of each when lines > 0, for tests that need a big diff).
func writeFileDiff(b *strings.Builder, f t3rpc.ChangedFile, turn int64, lines int) {
	add, del := int(f.Additions.Or(1)), int(f.Deletions.Or(0))
	if lines > 0 {
		add = max(add, lines)
	}
	fmt.Fprintf(b, "diff --git a/%s b/%s\nindex %07x..%07x 100644\n--- a/%s\n+++ b/%s\n", f.Path, f.Path, turn-1, turn, f.Path, f.Path)
	fmt.Fprintf(b, "@@ -1,%d +1,%d @@\n", del, add)
	for i := range del {
		fmt.Fprintf(b, "-line %d before turn %d\n", i+1, turn)
	}
	for i := range add {
		fmt.Fprintf(b, "+line %d of turn %d\n", i+1, turn)
	}
}

// SetDiffLines makes every file of every later diff at least n added lines long (0: as the
// checkpoint says), so tests can get a diff past the connector's size limit.
func (s *Server) SetDiffLines(n int) { s.diffLines.Store(int32(n)) }
