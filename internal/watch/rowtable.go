package watch

import (
	"strings"
	"unsafe"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/idindex"
)

// span is a string kept in a rowTable's arena: arena[off : off+n].
type span struct{ off, n uint32 }

// rowTable is a machine's rows, laid out for the garbage collector: at 100 machines × 1,000
// threads, rows as a map of pointers to structs of strings were ~400,000 objects and over a
// million pointers that every mark walked, the largest part of the connector's live heap
// (docs/benchmarks.md, issue 12). Here a machine's rows are a handful of objects, most of them
// without pointers, which the mark does not scan:
//
//   - rows is a slice of pointer-free row values; a removed thread's slot is zeroed and reused;
//   - every string of every row is a span of arena, one append-only []byte. Bytes once written
//     are never written again, so the strings handed out (views of the arena, no copy) stay as
//     they were however the table changes; a row's new string is appended unless it is the one
//     the row has already. When appending has made the arena more than twice what was live at
//     the last compaction, the live strings are copied into a new arena (compact) and the old
//     one is left to the collector once no handed-out string holds it;
//   - ids maps the thread id to its slot without a pointer per id (internal/idindex), a hit
//     checked against the slot's id;
//   - the strings of small sets (interned) share one span each, and model selections without
//     options one entry of models;
//   - the pointerful parts only a few rows have are in extra, by slot.
//
// It is the Watcher's, under its mutex.
type rowTable struct {
	rows []row
	free []uint32 // zeroed slots of rows, to reuse
	live int      // rows in use
	ids  idindex.Index

	arena []byte
	// compactAt is the arena length past which the next put compacts it: twice what was live
	// after the last compaction (or the snapshot), so compaction's copying is amortised over at
	// least as many appended bytes as it copies.
	compactAt int
	interned  map[string]span // keys are views of arena

	models   []t3rpc.ModelSelection
	modelIdx map[[2]string]uint32 // model's instance id and name → 1 + index in models

	extra map[uint32]*rowExtra
}

// minCompactAt keeps a small machine's arena from being compacted for every few rows.
const minCompactAt = 16 << 10

// maxInterned bounds the interned strings and the shared models: past it, new ones are kept as
// they are (correct, just not shared).
const maxInterned = 4096

func newRowTable() *rowTable {
	t := &rowTable{ids: idindex.Make(0), modelIdx: map[[2]string]uint32{}}
	t.reset(0, 0)
	return t
}

// reset empties the table for a snapshot of n rows whose strings are about arenaBytes long.
// Handed-out strings stay valid (they hold the old arena).
func (t *rowTable) reset(n, arenaBytes int) {
	t.rows = make([]row, 0, n)
	t.free = nil
	t.live = 0
	t.ids.Reset(n)
	t.arena = make([]byte, 0, arenaBytes)
	t.compactAt = max(2*arenaBytes, minCompactAt)
	t.interned = map[string]span{}
	t.extra = map[uint32]*rowExtra{}
}

// resetFor empties the table for the threads of a snapshot, with the arena sized for their
// strings (an arena grown by appending would hold up to a quarter more than it needs).
func (t *rowTable) resetFor(threads []t3rpc.ThreadShell) {
	n := 0
	for i := range threads {
		th := &threads[i]
		n += len(th.ID) + len(th.Title) + len(th.LatestRunId.Value)
		if th.ActiveRunId.Value != th.LatestRunId.Value {
			n += len(th.ActiveRunId.Value)
		}
	}
	// The interned strings: a few distinct ones per machine.
	t.reset(len(threads), n+512)
}

// str is s as a string: a view of the arena, never written again.
func (t *rowTable) str(s span) string {
	if s.n == 0 {
		return ""
	}
	return unsafe.String(&t.arena[s.off], int(s.n))
}

// add appends s to the arena.
func (t *rowTable) add(s string) span {
	if s == "" {
		return span{}
	}
	off := len(t.arena)
	t.arena = append(t.arena, s...)
	return span{off: uint32(off), n: uint32(len(s))}
}

// keep is the span for s of a row whose field was old: old itself when it holds s already (a
// thread's next row mostly repeats its title and run), else s appended.
func (t *rowTable) keep(old span, s string) span {
	if t.str(old) == s {
		return old
	}
	return t.add(s)
}

// intern is the shared span of s, one of a small set of strings.
func (t *rowTable) intern(s string) span {
	if s == "" {
		return span{}
	}
	if sp, ok := t.interned[s]; ok {
		return sp
	}
	sp := t.add(s)
	if len(t.interned) < maxInterned {
		t.interned[t.str(sp)] = sp
	}
	return sp
}

// model is the shared index (1 + index in models) of sel, or 0 when sel is kept in the row's
// extra (it has options, or the models are full).
func (t *rowTable) model(sel *t3rpc.ModelSelection) uint32 {
	if len(sel.Options) > 0 {
		return 0
	}
	k := [2]string{sel.InstanceId, sel.Model}
	if i, ok := t.modelIdx[k]; ok {
		return i
	}
	if len(t.models) >= maxInterned {
		return 0
	}
	t.models = append(t.models, *sel)
	i := uint32(len(t.models))
	t.modelIdx[k] = i
	return i
}

// slot finds the thread's row.
func (t *rowTable) slot(id string) (uint32, bool) {
	return t.ids.Find(id, t.idAt)
}

// idAt is the thread id of slot s.
func (t *rowTable) idAt(s uint32) string { return t.str(t.rows[s].id) }

func (t *rowTable) len() int { return t.live }

// put stores th's row, brought by the item of sequence seq, in the thread's slot (a new one
// for a thread the table does not hold).
func (t *rowTable) put(th *t3rpc.ThreadShell, seq int64) {
	s, ok := t.slot(th.ID)
	if !ok {
		s = t.newSlot(th.ID)
	}
	t.set(s, th, seq)
	if len(t.arena) > t.compactAt {
		t.compact()
	}
}

// newSlot takes a slot for a thread the table does not hold and indexes it.
func (t *rowTable) newSlot(id string) uint32 {
	var s uint32
	if n := len(t.free); n > 0 {
		s = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		s = uint32(len(t.rows))
		t.rows = append(t.rows, row{})
	}
	t.rows[s] = row{id: t.add(id), flags: rowLive}
	t.live++
	t.ids.Add(id, s)
	return s
}

// remove takes the thread's row out; it reports the row's project id and title (copies: they
// outlive the row, in the gone set).
func (t *rowTable) remove(id string) (projectID, title string, ok bool) {
	s, ok := t.slot(id)
	if !ok {
		return "", "", false
	}
	r := &t.rows[s]
	projectID, title = strings.Clone(t.str(r.projectID)), strings.Clone(t.str(r.title))
	t.ids.Remove(id, s)
	delete(t.extra, s)
	*r = row{}
	t.free = append(t.free, s)
	t.live--
	return projectID, title, true
}

// set fills slot s from th (the slot's id is th's already).
func (t *rowTable) set(s uint32, th *t3rpc.ThreadShell, seq int64) {
	old := t.rows[s]
	r := row{
		id:              old.id,
		title:           t.keep(old.title, th.Title),
		projectID:       t.intern(th.ProjectId),
		status:          t.intern(th.Status),
		runtimeMode:     t.intern(th.RuntimeMode.Value),
		interactionMode: t.intern(th.InteractionMode.Value),
		activity:        t.intern(th.ActivityRunStatus.Value),
		itemCount:       th.ItemCount.Value,
		seq:             seq,
		flags:           rowLive,
	}
	// The run ids: kept when the thread's row before had them (either way round, as a run
	// goes from active to latest only).
	switch l := th.LatestRunId.Value; l {
	case t.str(old.latestRun):
		r.latestRun = old.latestRun
	case t.str(old.activeRun):
		r.latestRun = old.activeRun
	default:
		r.latestRun = t.add(l)
	}
	switch a := th.ActiveRunId.Value; a {
	case th.LatestRunId.Value:
		r.activeRun = r.latestRun
	case t.str(old.activeRun):
		r.activeRun = old.activeRun
	default:
		r.activeRun = t.add(a)
	}
	// x is the slot's extra, taken (and cleared) once the row turns out to need one.
	var x *rowExtra
	extra := func() *rowExtra {
		if x == nil {
			if x = t.extra[s]; x == nil {
				x = new(rowExtra)
				t.extra[s] = x
			}
			*x = rowExtra{}
			r.flags |= rowHasExtra
		}
		return x
	}
	if th.ModelSelection.Set {
		r.setState(optModel, value)
		if r.model = t.model(&th.ModelSelection.Value); r.model == 0 {
			extra().model = th.ModelSelection.Value
		}
	}
	r.setState(optRuntimeMode, strState(th.RuntimeMode))
	r.setState(optInteractionMode, strState(th.InteractionMode))
	r.setState(optLatestRun, nilStrState(th.LatestRunId))
	r.setState(optActiveRun, nilStrState(th.ActiveRunId))
	r.setState(optActivity, nilStrState(th.ActivityRunStatus))
	switch p := th.PendingRuntimeRequest; {
	case p.Set && p.Null:
		r.setState(optPending, null)
	case p.Set:
		r.setState(optPending, value)
		extra().pending = p.Value
	}
	if th.ItemCount.Set {
		r.setState(optItemCount, value)
	}
	switch {
	case th.LastError == nil:
	case string(th.LastError) == "null":
		r.flags |= lastErrorNull
	default:
		r.flags |= lastErrorExtra
		extra().lastError = append(jx.Raw(nil), th.LastError...)
	}
	switch b, w := th.Branch, th.WorktreePath; {
	case !b.Set && !w.Set:
	case b.Set && b.Null && w.Set && w.Null:
		r.flags |= wsNull
	default:
		r.flags |= wsExtra
		extra().branch, extra().worktree = b, w
	}
	stamps := [nStamps]struct {
		s optState
		v string
	}{
		stampRequested: {nilStrState(th.LatestRunRequestedAt), th.LatestRunRequestedAt.Value},
		stampStarted:   {nilStrState(th.LatestRunStartedAt), th.LatestRunStartedAt.Value},
		stampCompleted: {nilStrState(th.LatestRunCompletedAt), th.LatestRunCompletedAt.Value},
		stampCreated:   {strState(th.CreatedAt), th.CreatedAt.Value},
		stampUpdated:   {strState(th.UpdatedAt), th.UpdatedAt.Value},
		stampArchived:  {nilStrState(th.ArchivedAt), th.ArchivedAt.Value},
		stampDeleted:   {nilStrState(th.DeletedAt), th.DeletedAt.Value},
	}
	for i, st := range stamps {
		r.setState(optStamp0+i, st.s)
		if st.s != value {
			continue
		}
		if ms, ok := parseMillis(st.v); ok {
			r.stamps[i] = ms
			continue
		}
		extra().odd[i] = st.v
		r.oddMask |= 1 << i
	}
	if x == nil && old.flags&rowHasExtra != 0 {
		delete(t.extra, s)
	}
	t.rows[s] = r
}

// compact copies the strings the rows use into a new arena and lets the old arena go (strings
// handed out keep it while they live). Spans the rows share stay shared: an active run that is
// the latest, and the interned strings (those no row uses any more are forgotten).
func (t *rowTable) compact() {
	old := t.arena
	// Room for what the rows append until the next compaction, so the arena is not grown (and
	// copied) by appends in between; pages not yet appended to are not touched.
	t.arena = make([]byte, 0, len(old))
	copyOf := func(sp span) span { return t.add(unsafe.String(&old[sp.off], int(sp.n))) }
	oldInterned := t.interned
	t.interned = make(map[string]span, len(oldInterned))
	// Most rows share their small-set spans with the row before: the last remap of each field.
	var lastFrom, lastTo [5]span
	for i := range t.rows {
		r := &t.rows[i]
		if r.flags&rowLive == 0 {
			continue
		}
		r.id, r.title = copyOf(r.id), copyOf(r.title)
		shared := r.activeRun == r.latestRun
		r.latestRun = copyOf(r.latestRun)
		if shared {
			r.activeRun = r.latestRun
		} else {
			r.activeRun = copyOf(r.activeRun)
		}
		for f, sp := range [5]*span{&r.projectID, &r.status, &r.runtimeMode, &r.interactionMode, &r.activity} {
			switch from := *sp; {
			case from.n == 0:
			case from == lastFrom[f]:
				*sp = lastTo[f]
			default:
				str := unsafe.String(&old[from.off], int(from.n))
				if oldInterned[str] == from {
					*sp = t.intern(str)
				} else {
					*sp = copyOf(from) // not interned (the set was full)
				}
				lastFrom[f], lastTo[f] = from, *sp
			}
		}
	}
	t.compactAt = max(2*len(t.arena), minCompactAt)
}

// stamp is stamp i of slot s as T3 sent it.
func (t *rowTable) stamp(s uint32, r *row, i int) string {
	if r.oddMask&(1<<i) != 0 {
		return t.extra[s].odd[i]
	}
	return r.stamp(i)
}

func (t *rowTable) stampString(s uint32, r *row, i int) t3rpc.OptString {
	if r.state(optStamp0+i) == value {
		return t3rpc.NewOptString(t.stamp(s, r, i))
	}
	return t3rpc.OptString{}
}

func (t *rowTable) stampNilString(s uint32, r *row, i int) t3rpc.OptNilString {
	switch r.state(optStamp0 + i) {
	case null:
		return t3rpc.OptNilString{Set: true, Null: true}
	case value:
		return t3rpc.NewOptNilString(t.stamp(s, r, i))
	}
	return t3rpc.OptNilString{}
}

// shell rebuilds the row of slot s (without latestVisibleMessage). Its strings are views of
// the arena.
func (t *rowTable) shell(s uint32) t3rpc.ThreadShell {
	r := &t.rows[s]
	var x *rowExtra
	if r.flags&rowHasExtra != 0 {
		x = t.extra[s]
	}
	th := t3rpc.ThreadShell{
		ID:                   t.str(r.id),
		ProjectId:            t.str(r.projectID),
		Title:                t.str(r.title),
		RuntimeMode:          r.optString(optRuntimeMode, t.str(r.runtimeMode)),
		InteractionMode:      r.optString(optInteractionMode, t.str(r.interactionMode)),
		Status:               t.str(r.status),
		LatestRunId:          r.optNilString(optLatestRun, t.str(r.latestRun)),
		ActiveRunId:          r.optNilString(optActiveRun, t.str(r.activeRun)),
		LatestRunRequestedAt: t.stampNilString(s, r, stampRequested),
		LatestRunStartedAt:   t.stampNilString(s, r, stampStarted),
		LatestRunCompletedAt: t.stampNilString(s, r, stampCompleted),
		ActivityRunStatus:    r.optNilString(optActivity, t.str(r.activity)),
		CreatedAt:            t.stampString(s, r, stampCreated),
		UpdatedAt:            t.stampString(s, r, stampUpdated),
		ArchivedAt:           t.stampNilString(s, r, stampArchived),
		DeletedAt:            t.stampNilString(s, r, stampDeleted),
	}
	switch {
	case r.flags&lastErrorNull != 0:
		th.LastError = nullRaw
	case r.flags&lastErrorExtra != 0:
		th.LastError = x.lastError
	}
	switch {
	case r.flags&wsNull != 0:
		th.Branch, th.WorktreePath = t3rpc.OptNilString{Set: true, Null: true}, t3rpc.OptNilString{Set: true, Null: true}
	case r.flags&wsExtra != 0:
		th.Branch, th.WorktreePath = x.branch, x.worktree
	}
	if r.state(optModel) == value {
		if r.model > 0 {
			th.ModelSelection = t3rpc.NewOptModelSelection(t.models[r.model-1])
		} else {
			th.ModelSelection = t3rpc.NewOptModelSelection(x.model)
		}
	}
	switch r.state(optPending) {
	case null:
		th.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	case value:
		th.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(x.pending)
	}
	if r.state(optItemCount) == value {
		th.ItemCount = t3rpc.NewOptInt64(r.itemCount)
	}
	return th
}

// each calls f with the slot of every row.
func (t *rowTable) each(f func(s uint32)) {
	for i := range t.rows {
		if t.rows[i].flags&rowLive != 0 {
			f(uint32(i))
		}
	}
}
