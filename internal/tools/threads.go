package tools

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
)

// Paging and search bounds of t3_threads.
const (
	threadsPageDefault = 25
	threadsPageMax     = 100
	// searchLimit is T3's own maximum for searchThreads (fixture 23).
	searchLimit = 50
)

// listed is one row of t3_threads before paging.
type listed struct {
	shell    t3rpc.ThreadShell
	archived bool
	match    string
}

func threadsTool(d *Deps) func(context.Context, *Call, *mcptools.ThreadsInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.ThreadsInput) (Result, error) {
		const tool = mcptools.ToolThreads
		m, err := d.readyMachine(tool, in.Machine)
		if err != nil {
			return Result{}, err
		}
		q, err := threadsQueryOf(tool, m, in)
		if err != nil {
			return Result{}, err
		}
		rows, err := listThreads(ctx, tool, m, in)
		if err != nil {
			return Result{}, err
		}
		answered := d.answered.snapshot()
		rows = q.filter(rows, answered)

		onMachine, err := trackedOn(d.Threads, m.Name)
		if err != nil {
			return Result{}, err
		}
		out := mcptools.ThreadsOutput{Machine: m.Name, Threads: []mcptools.ThreadEntry{}, Total: len(rows)}
		page := rows[min(q.offset, len(rows)):]
		if len(page) > q.limit {
			page = page[:q.limit]
			out.NextCursor.SetTo(strconv.Itoa(q.offset + q.limit))
		}
		var b strings.Builder
		for _, r := range page {
			e := entryOf(m, r, onMachine, answered)
			out.Threads = append(out.Threads, e)
			writeEntry(&b, e)
		}
		switch {
		case len(rows) == 0:
			fmt.Fprintf(&b, "no thread on machine %q matches", m.Name)
		case len(page) == 0:
			fmt.Fprintf(&b, "no threads past cursor %d (%d in all)", q.offset, len(rows))
		default:
			fmt.Fprintf(&b, "%d–%d of %d", q.offset+1, q.offset+len(page), len(rows))
			if nc, ok := out.NextCursor.Get(); ok {
				fmt.Fprintf(&b, "; next page: cursor %s", nc)
			}
		}
		return Result{Structured: &out, Text: b.String()}, nil
	}
}

// threadsQuery is t3_threads' page and filters, checked.
type threadsQuery struct {
	limit, offset int
	status        string // "" for any
	projectID     string // "" for any
}

func threadsQueryOf(tool string, m *fleet.Machine, in *mcptools.ThreadsInput) (threadsQuery, error) {
	q := threadsQuery{limit: in.Limit.Or(threadsPageDefault)}
	if q.limit < 1 || q.limit > threadsPageMax {
		return q, fmt.Errorf("%s: limit must be between 1 and %d, not %d", tool, threadsPageMax, q.limit)
	}
	if cur, ok := in.Cursor.Get(); ok && cur != "" {
		n, err := strconv.Atoi(cur)
		if err != nil || n < 0 {
			return q, fmt.Errorf("%s: cursor %s is not one this tool returned; pass next_cursor from the previous page, or leave it out for the first page", tool, text.Quoted(cur))
		}
		q.offset = n
	}
	q.status = strings.TrimSpace(in.Status.Or(""))
	if q.status != "" && !slices.Contains(threadStatuses, q.status) {
		return q, fmt.Errorf("%s: status %s is not one it filters on; use one of %s, or leave status out", tool, text.Quoted(q.status), strings.Join(threadStatuses, ", "))
	}
	if ref, ok := in.Project.Get(); ok && strings.TrimSpace(ref) != "" {
		p, err := m.Project(ref)
		if err != nil {
			return q, err
		}
		q.projectID = p.ID
	}
	return q, nil
}

// filter keeps the rows of the project and status asked for, newest first.
func (q threadsQuery) filter(rows []listed, answered map[string]bool) []listed {
	kept := rows[:0]
	for _, r := range rows {
		if q.projectID != "" && r.shell.ProjectId != q.projectID {
			continue
		}
		if q.status != "" && !statusMatches(&r.shell, q.status, answered) {
			continue
		}
		kept = append(kept, r)
	}
	sort.SliceStable(kept, func(i, j int) bool {
		a, b := kept[i].shell.UpdatedAt.Or(""), kept[j].shell.UpdatedAt.Or("")
		if a != b {
			return a > b
		}
		return kept[i].shell.ID < kept[j].shell.ID
	})
	return kept
}

// listThreads is the machine's threads t3_threads looks at: the live ones,
// the archived ones when asked for, narrowed to a search's matches.
func listThreads(ctx context.Context, tool string, m *fleet.Machine, in *mcptools.ThreadsInput) ([]listed, error) {
	var rows []listed
	for _, t := range m.Threads() {
		rows = append(rows, listed{shell: t})
	}
	if in.Archived.Or(false) {
		arch, err := m.ArchivedThreads(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: reading the archived threads of machine %q failed: %w", tool, m.Name, err)
		}
		for _, t := range arch {
			rows = append(rows, listed{shell: t, archived: true})
		}
	}
	q, ok := in.Query.Get()
	if !ok {
		return rows, nil
	}
	q = strings.TrimSpace(q)
	if utf8.RuneCountInString(q) < 2 {
		return nil, fmt.Errorf("%s: query must have at least 2 characters (T3 searches message text)", tool)
	}
	matches, err := m.SearchThreads(ctx, q, searchLimit)
	if err != nil {
		return nil, fmt.Errorf("%s: searching the threads of machine %q failed: %w", tool, m.Name, err)
	}
	snippet := map[string]string{}
	for _, mt := range matches {
		if _, seen := snippet[mt.ThreadId]; !seen {
			snippet[mt.ThreadId] = mt.Snippet.Or("")
		}
	}
	kept := rows[:0]
	for _, r := range rows {
		if s, ok := snippet[r.shell.ID]; ok {
			r.match = s
			kept = append(kept, r)
		} else if r.archived {
			// T3's search leaves archived threads out: match them here on
			// what their rows hold (title, latest message).
			if s, ok := archivedMatch(&r.shell, q); ok {
				r.match = s
				kept = append(kept, r)
			}
		}
	}
	return kept, nil
}

// writeEntry writes one thread's line of t3_threads' text.
func writeEntry(b *strings.Builder, e mcptools.ThreadEntry) {
	fmt.Fprintf(b, "%s %q (%s): %s", e.ThreadID, e.Title, e.Project.Title, e.Status)
	if q, ok := e.Question.Get(); ok {
		fmt.Fprintf(b, ", asks (%s)", q)
	}
	if br, ok := e.Branch.Get(); ok {
		fmt.Fprintf(b, ", branch %s", br)
	}
	if e.Archived.Or(false) {
		b.WriteString(", archived")
	}
	switch {
	case e.Watching:
		b.WriteString(", watched")
	case e.Tracked:
		b.WriteString(", tracked")
	}
	b.WriteString("\n")
}

// threadStatuses are the values t3_threads filters on: T3's run statuses
// (fixtures 05–23; the row says idle before a first run), busy and question.
var threadStatuses = []string{"idle", "preparing", "queued", "starting", "running", "waiting", "completed", "interrupted", "failed", "cancelled", "rolled_back", "busy", "question"}

// archivedMatch matches an archived thread to a query, case-insensitively,
// on its title or latest visible message (T3's searchThreads skips archived
// threads); the match is the text that held it.
func archivedMatch(t *t3rpc.ThreadShell, query string) (string, bool) {
	q := strings.ToLower(query)
	if strings.Contains(strings.ToLower(t.Title), q) {
		return t.Title, true
	}
	if m, ok := t.LatestVisibleMessage.Get(); ok && strings.Contains(strings.ToLower(m.Text), q) {
		return text.Cut(m.Text, 200), true
	}
	return "", false
}

// statusMatches applies t3_threads' status filter: busy, question, or a T3
// status word.
func statusMatches(t *t3rpc.ThreadShell, want string, answered map[string]bool) bool {
	switch want {
	case "busy":
		return threadstate.Busy(t)
	case "question":
		pr, ok := threadstate.PendingRequest(t)
		return ok && !answered[pr.ID]
	}
	return t.Status == want
}

// trackedOn maps the ids of the threads the state file tracks on a machine.
func trackedOn(st TrackedThreads, machine string) (map[string]tracked.Thread, error) {
	all, err := st.ListThreads()
	if err != nil {
		return nil, err
	}
	out := make(map[string]tracked.Thread, len(all))
	for _, t := range all {
		if t.Machine == machine {
			out[t.ID] = t
		}
	}
	return out, nil
}

func entryOf(m *fleet.Machine, r listed, trackedByID map[string]tracked.Thread, answered map[string]bool) mcptools.ThreadEntry {
	t := r.shell
	e := mcptools.ThreadEntry{ThreadID: t.ID, Title: t.Title, Status: t.Status, Project: mcptools.ProjectRef{ID: t.ProjectId}}
	if p, ok := m.ProjectByID(t.ProjectId); ok {
		e.Project.Title = p.Title
	}
	if id := threadstate.LatestRun(&t); id != "" {
		e.LatestRunID.SetTo(id)
	}
	if pr, ok := threadstate.PendingRequest(&t); ok && !answered[pr.ID] {
		if pr.IsQuestion() {
			e.Question.SetTo(mcptools.QuestionKindUserInput)
		} else {
			e.Question.SetTo(mcptools.QuestionKindApproval)
		}
	}
	if v, ok := t.Branch.Get(); ok && v != "" {
		e.Branch.SetTo(v)
	}
	if v, ok := t.WorktreePath.Get(); ok && v != "" {
		e.Worktree.SetTo(v)
	}
	if r.archived {
		e.Archived.SetTo(true)
	}
	if v, ok := t.UpdatedAt.Get(); ok {
		e.UpdatedAt.SetTo(v)
	}
	if r.match != "" {
		e.Match.SetTo(r.match)
	}
	if tr, ok := trackedByID[t.ID]; ok {
		e.Tracked, e.Watching = true, tr.Watch
	}
	return e
}
