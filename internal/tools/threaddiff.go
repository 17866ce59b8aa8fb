package tools

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// maxDiffBytes bounds the diff t3_thread returns; the rest is cut with a
// marker that gives the total size.
const maxDiffBytes = 24 << 10

// runDiff is t3_thread's diff of one run (runID, or the latest): T3's
// getTurnDiff from the checkpoint before the run (turn ordinal-1) to the
// run's own (turn ordinal). At the recorded build T3 cannot diff a thread's
// first run (fixture 22: a range from turn 0 fails once the thread has two
// runs and is empty before), so that case, a run still going and any refusal
// are said in unavailable, with the files from the run's checkpoint.
func (d *Deps) runDiff(ctx context.Context, f fleet.Found, p *t3api.ThreadProjection, runID string) (mcptools.RunDiff, error) {
	if runID == "" {
		runID = threadstate.LatestRun(&f.Shell)
	}
	var run *t3api.Run
	for i := range p.Runs {
		if p.Runs[i].ID == runID || (runID == "" && (run == nil || p.Runs[i].Ordinal > run.Ordinal)) {
			run = &p.Runs[i]
		}
	}
	if run == nil {
		if runID == "" {
			return mcptools.RunDiff{}, fmt.Errorf("%s: thread %q has no run yet, so there is no diff", mcptools.ToolThread, f.Shell.ID)
		}
		return mcptools.RunDiff{}, fmt.Errorf("%s: thread %q has no run %s; run ids are in runs[].run_id of t3_thread", mcptools.ToolThread, f.Shell.ID, text.Quoted(runID))
	}
	out := mcptools.RunDiff{RunID: run.ID, Files: checkpointFiles(p, run)}
	if _, settled := threadstate.Settled(run.Status); !settled {
		out.Unavailable.SetTo(fmt.Sprintf("run %s is %s: T3 diffs a run once it has ended and its checkpoint is captured", run.ID, run.Status))
		return out, nil
	}
	if run.Ordinal <= 1 {
		out.Unavailable.SetTo("T3 cannot diff a thread's first run (it keeps no checkpoint from before it); files lists what its checkpoint recorded")
		return out, nil
	}
	diff, err := f.Machine.TurnDiff(ctx, f.Shell.ID, run.Ordinal-1, run.Ordinal)
	if err != nil {
		if ctx.Err() != nil {
			return mcptools.RunDiff{}, err
		}
		out.Unavailable.SetTo(fmt.Sprintf("T3 could not give the diff of run %s: %v; files lists what its checkpoint recorded", run.ID, err))
		return out, nil
	}
	out.TotalBytes = len(diff)
	if files := diffFiles(diff); len(files) > 0 {
		out.Files = files
	}
	out.Diff = cutDiff(diff, maxDiffBytes)
	return out, nil
}

// checkpointFiles are the files the run's checkpoint lists.
func checkpointFiles(p *t3api.ThreadProjection, run *t3api.Run) []mcptools.ChangedFile {
	out := []mcptools.ChangedFile{}
	cp, _ := run.CheckpointId.Get()
	for _, c := range p.Checkpoints {
		if (cp != "" && c.ID == cp) || c.RunId.Or("") == run.ID {
			for _, f := range c.Files {
				cf := mcptools.ChangedFile{Path: f.Path, Kind: mcptools.OptString(f.Kind)}
				if v, ok := f.Additions.Get(); ok {
					cf.Additions.SetTo(int(v))
				}
				if v, ok := f.Deletions.Get(); ok {
					cf.Deletions.SetTo(int(v))
				}
				out = append(out, cf)
			}
			break
		}
	}
	return out
}

// diffFiles reads the files of a git diff with their kind and line counts
// (T3's checkpoint calls every file modified; the diff knows better).
func diffFiles(diff string) []mcptools.ChangedFile {
	var out []mcptools.ChangedFile
	var cur *mcptools.ChangedFile
	inHunk := false
	for line := range strings.Lines(diff) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "diff --git "):
			out = append(out, mcptools.ChangedFile{Path: gitPath(line)})
			cur = &out[len(out)-1]
			cur.Kind.SetTo("modified")
			cur.Additions.SetTo(0)
			cur.Deletions.SetTo(0)
			inHunk = false
		case cur == nil:
		case !inHunk && strings.HasPrefix(line, "new file mode"):
			cur.Kind.SetTo("added")
		case !inHunk && strings.HasPrefix(line, "deleted file mode"):
			cur.Kind.SetTo("deleted")
		case !inHunk && strings.HasPrefix(line, "rename to "):
			cur.Kind.SetTo("renamed")
			cur.Path = strings.TrimPrefix(line, "rename to ")
		case strings.HasPrefix(line, "@@"):
			inHunk = true
		case inHunk && strings.HasPrefix(line, "+"):
			cur.Additions.SetTo(cur.Additions.Value + 1)
		case inHunk && strings.HasPrefix(line, "-"):
			cur.Deletions.SetTo(cur.Deletions.Value + 1)
		}
	}
	return out
}

// gitPath is the b/ path of a "diff --git a/x b/x" line.
func gitPath(line string) string {
	rest := strings.TrimPrefix(line, "diff --git ")
	if i := strings.LastIndex(rest, " b/"); i >= 0 {
		return rest[i+3:]
	}
	return rest
}

// cutDiff keeps whole lines of diff up to limit bytes and says what was cut.
func cutDiff(diff string, limit int) string {
	if len(diff) <= limit {
		return diff
	}
	cut := strings.LastIndexByte(diff[:limit], '\n') + 1
	return diff[:cut] + "… [diff cut: " + strconv.Itoa(cut) + " of " + strconv.Itoa(len(diff)) + " bytes shown]\n"
}
