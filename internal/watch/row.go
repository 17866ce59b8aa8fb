package watch

import (
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// row is what the watcher keeps of one thread's shell row: every field of t3rpc.ThreadShell
// except latestVisibleMessage, in a compact form. A full ThreadShell is ~600 bytes of struct plus
// a dozen strings; at 100,000 threads the copies were the largest part of the connector's heap
// (docs/benchmarks.md). Here:
//
//   - latestVisibleMessage is not kept: nothing in the connector reads it from the watcher (the
//     event detector gets the decoded rows of each chunk, not these), and on T3 it holds the
//     last message's text, which can be long. Thread and Threads return it unset.
//   - timestamps in T3's format (2006-01-02T15:04:05.000Z) are kept as Unix milliseconds and
//     formatted again when read, which gives back the same string; any other string is kept
//     verbatim (odd);
//   - strings of a small set (project id, status, runtime and interaction mode, activity status,
//     request kind, model selection) are interned per watcher;
//   - an active run id equal to the latest run id shares its string;
//   - which optional fields were absent, null or set is two bits each.
//
// TestRowRoundTrip checks that every kept field reads back as it was decoded.
type row struct {
	title, projectID, status       string
	runtimeMode, interactionMode   string
	activity, latestRun, activeRun string
	model                          *t3rpc.ModelSelection
	pending                        *t3rpc.PendingRuntimeRequest
	lastError                      jx.Raw
	itemCount                      int64
	stamps                         [nStamps]int64
	odd                            *[nStamps]string // stamps not in T3's format, verbatim
	states                         uint32           // optState per optional field, 2 bits each
	oddMask                        uint8            // which stamps are in odd
	// ws is branch and worktreePath; nil when both were absent, and the one
	// shared nullWorkspace when both were null (nearly every thread not on a
	// worktree), so most rows pay one pointer for them.
	ws *rowWorkspace
	// seq is the sequence of the item that brought the row (a snapshot's
	// snapshotSequence): T3 gives a thread's row the sequence of its newest
	// event, so a thread subscription whose cursor has reached seq shows at
	// least what the row shows (Watcher.ThreadAt).
	seq int64
}

// rowWorkspace is a row's branch and worktreePath, kept as they came.
type rowWorkspace struct {
	branch, worktree t3rpc.OptNilString
}

var nullWorkspace = &rowWorkspace{branch: t3rpc.OptNilString{Set: true, Null: true}, worktree: t3rpc.OptNilString{Set: true, Null: true}}

func workspaceOf(t *t3rpc.ThreadShell) *rowWorkspace {
	b, w := t.Branch, t.WorktreePath
	switch {
	case !b.Set && !w.Set:
		return nil
	case b.Set && b.Null && w.Set && w.Null:
		return nullWorkspace
	}
	return &rowWorkspace{branch: b, worktree: w}
}

// Stamp indexes.
const (
	stampRequested = iota
	stampStarted
	stampCompleted
	stampCreated
	stampUpdated
	stampArchived
	stampDeleted
	nStamps
)

// Optional fields, each with its optState in row.states.
const (
	optModel = iota
	optRuntimeMode
	optInteractionMode
	optLatestRun
	optActiveRun
	optActivity
	optPending
	optItemCount
	optStamp0 // nStamps stamps follow
)

// optState is how an optional field came: absent, null or with a value.
type optState uint32

const (
	absent optState = iota
	null
	value
)

func (r *row) state(field int) optState { return optState(r.states>>(2*field)) & 3 }

func (r *row) setState(field int, s optState) {
	r.states = r.states&^(3<<(2*field)) | uint32(s)<<(2*field)
}

func strState(o t3rpc.OptString) optState {
	if o.Set {
		return value
	}
	return absent
}

func nilStrState(o t3rpc.OptNilString) optState {
	switch {
	case !o.Set:
		return absent
	case o.Null:
		return null
	}
	return value
}

func (r *row) optString(field int, v string) t3rpc.OptString {
	if r.state(field) == value {
		return t3rpc.NewOptString(v)
	}
	return t3rpc.OptString{}
}

func (r *row) optNilString(field int, v string) t3rpc.OptNilString {
	switch r.state(field) {
	case null:
		return t3rpc.OptNilString{Set: true, Null: true}
	case value:
		return t3rpc.NewOptNilString(v)
	}
	return t3rpc.OptNilString{}
}

// interner shares the strings of small sets between rows. It is bounded: past maxInterned
// distinct strings, new ones are kept as they are (correct, just not shared).
type interner map[string]string

const maxInterned = 4096

func (in interner) str(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := in[s]; ok {
		return v
	}
	if len(in) < maxInterned {
		in[s] = s
	}
	return s
}

// models shares model selections without options between rows.
type models map[[2]string]*t3rpc.ModelSelection

func (m models) get(sel t3rpc.ModelSelection) *t3rpc.ModelSelection {
	if len(sel.Options) > 0 || len(m) >= maxInterned {
		return &sel
	}
	k := [2]string{sel.InstanceId, sel.Model}
	if p, ok := m[k]; ok {
		return p
	}
	p := &sel
	m[k] = p
	return p
}

// nullRaw is the lastError of nearly every row.
var nullRaw = jx.Raw("null")

// set fills r from t (r is reused for a thread's next row).
func (r *row) set(t *t3rpc.ThreadShell, in interner, ms models) {
	*r = row{
		title:           t.Title,
		projectID:       in.str(t.ProjectId),
		status:          in.str(t.Status),
		runtimeMode:     in.str(t.RuntimeMode.Value),
		interactionMode: in.str(t.InteractionMode.Value),
		activity:        in.str(t.ActivityRunStatus.Value),
		latestRun:       t.LatestRunId.Value,
		activeRun:       t.ActiveRunId.Value,
		itemCount:       t.ItemCount.Value,
		ws:              workspaceOf(t),
	}
	if r.activeRun == r.latestRun {
		r.activeRun = r.latestRun
	}
	if t.ModelSelection.Set {
		r.model = ms.get(t.ModelSelection.Value)
		r.setState(optModel, value)
	}
	r.setState(optRuntimeMode, strState(t.RuntimeMode))
	r.setState(optInteractionMode, strState(t.InteractionMode))
	r.setState(optLatestRun, nilStrState(t.LatestRunId))
	r.setState(optActiveRun, nilStrState(t.ActiveRunId))
	r.setState(optActivity, nilStrState(t.ActivityRunStatus))
	switch p := t.PendingRuntimeRequest; {
	case p.Set && p.Null:
		r.setState(optPending, null)
	case p.Set:
		v := p.Value
		v.Kind = in.str(v.Kind)
		r.pending = &v
		r.setState(optPending, value)
	}
	if t.ItemCount.Set {
		r.setState(optItemCount, value)
	}
	switch {
	case t.LastError == nil:
	case string(t.LastError) == "null":
		r.lastError = nullRaw
	default:
		r.lastError = append(jx.Raw(nil), t.LastError...)
	}
	r.setStamp(stampRequested, nilStrState(t.LatestRunRequestedAt), t.LatestRunRequestedAt.Value)
	r.setStamp(stampStarted, nilStrState(t.LatestRunStartedAt), t.LatestRunStartedAt.Value)
	r.setStamp(stampCompleted, nilStrState(t.LatestRunCompletedAt), t.LatestRunCompletedAt.Value)
	r.setStamp(stampCreated, strState(t.CreatedAt), t.CreatedAt.Value)
	r.setStamp(stampUpdated, strState(t.UpdatedAt), t.UpdatedAt.Value)
	r.setStamp(stampArchived, nilStrState(t.ArchivedAt), t.ArchivedAt.Value)
	r.setStamp(stampDeleted, nilStrState(t.DeletedAt), t.DeletedAt.Value)
}

func (r *row) setStamp(i int, s optState, v string) {
	r.setState(optStamp0+i, s)
	if s != value {
		return
	}
	if ms, ok := parseMillis(v); ok {
		r.stamps[i] = ms
		return
	}
	if r.odd == nil {
		r.odd = new([nStamps]string)
	}
	r.odd[i] = v
	r.oddMask |= 1 << i
}

func (r *row) stamp(i int) string {
	if r.oddMask&(1<<i) != 0 {
		return r.odd[i]
	}
	return time.UnixMilli(r.stamps[i]).UTC().Format(isoMillis)
}

func (r *row) stampString(i int) t3rpc.OptString {
	if r.state(optStamp0+i) == value {
		return t3rpc.NewOptString(r.stamp(i))
	}
	return t3rpc.OptString{}
}

func (r *row) stampNilString(i int) t3rpc.OptNilString {
	switch r.state(optStamp0 + i) {
	case null:
		return t3rpc.OptNilString{Set: true, Null: true}
	case value:
		return t3rpc.NewOptNilString(r.stamp(i))
	}
	return t3rpc.OptNilString{}
}

// shell rebuilds the thread's row (without latestVisibleMessage).
func (r *row) shell(id string) t3rpc.ThreadShell {
	t := t3rpc.ThreadShell{
		ID:                   id,
		ProjectId:            r.projectID,
		Title:                r.title,
		RuntimeMode:          r.optString(optRuntimeMode, r.runtimeMode),
		InteractionMode:      r.optString(optInteractionMode, r.interactionMode),
		Status:               r.status,
		LatestRunId:          r.optNilString(optLatestRun, r.latestRun),
		ActiveRunId:          r.optNilString(optActiveRun, r.activeRun),
		LatestRunRequestedAt: r.stampNilString(stampRequested),
		LatestRunStartedAt:   r.stampNilString(stampStarted),
		LatestRunCompletedAt: r.stampNilString(stampCompleted),
		ActivityRunStatus:    r.optNilString(optActivity, r.activity),
		LastError:            r.lastError,
		CreatedAt:            r.stampString(stampCreated),
		UpdatedAt:            r.stampString(stampUpdated),
		ArchivedAt:           r.stampNilString(stampArchived),
		DeletedAt:            r.stampNilString(stampDeleted),
	}
	if r.ws != nil {
		t.Branch, t.WorktreePath = r.ws.branch, r.ws.worktree
	}
	if r.state(optModel) == value {
		t.ModelSelection = t3rpc.NewOptModelSelection(*r.model)
	}
	switch r.state(optPending) {
	case null:
		t.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	case value:
		t.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(*r.pending)
	}
	if r.state(optItemCount) == value {
		t.ItemCount = t3rpc.NewOptInt64(r.itemCount)
	}
	return t
}

// isoMillis is T3's timestamp format.
const isoMillis = "2006-01-02T15:04:05.000Z"

// parseMillis reads a timestamp in exactly T3's format, and only one that formats back to the
// same string (no out-of-range field that time.Date would normalise).
func parseMillis(s string) (int64, bool) {
	if len(s) != len(isoMillis) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[23] != 'Z' {
		return 0, false
	}
	num := func(i, n int) (int, bool) {
		v := 0
		for _, c := range []byte(s[i : i+n]) {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	y, ok1 := num(0, 4)
	mo, ok2 := num(5, 2)
	d, ok3 := num(8, 2)
	h, ok4 := num(11, 2)
	mi, ok5 := num(14, 2)
	sec, ok6 := num(17, 2)
	milli, ok7 := num(20, 3)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 {
		return 0, false
	}
	t := time.Date(y, time.Month(mo), d, h, mi, sec, milli*int(time.Millisecond), time.UTC)
	if t.Year() != y || int(t.Month()) != mo || t.Day() != d || t.Hour() != h || t.Minute() != mi || t.Second() != sec {
		return 0, false
	}
	return t.UnixMilli(), true
}
