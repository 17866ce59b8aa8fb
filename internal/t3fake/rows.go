package t3fake

import (
	"strconv"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Shell rows, encoded with the parts that repeat taken from a cache.
//
// A default-script run publishes eight rows of its thread, and most of each row is the same from
// one to the next: the thread's identity and settings (id, project, title, model selection,
// modes), the run's id (latestRunId, activeRunId) and the last visible message (the prompt, then
// the reply). Encoding those again for every row, escaping every byte of the prompt eight times,
// was most of the fake's cost per step under load (docs/benchmarks.md). rowCache keeps their
// encoded bytes, each with the values it was made from: a value that differs from its key is
// encoded again, so the cache can be stale in no way but cost. The row itself is written field by
// field in the order of t3rpc.ThreadShell.Encode, each key a literal (appendRow);
// TestShellRowsMatchGenerated and TestShellRowCacheFollowsChanges pin the bytes to the generated
// encoder's.

// rowCache holds the encoded parts of one thread's rows. A thread holds one while a run is active
// (the rows come in bursts then); an idle thread's row is encoded through the server's spare one.
type rowCache struct {
	headKey rowHead
	head    []byte // the fields id … interactionMode, as `"id":…,"interactionMode":…`
	runKey  string
	run     []byte // the JSON string of runKey
	lvmKey  t3rpc.OptNilVisibleMessage
	lvm     []byte // latestVisibleMessage's value
	scratch jx.Encoder
	// Writers kept here, not on the stack: jx's writer methods make theirs escape, one
	// allocation per row.
	fw     fields
	runIDw jx.Writer
}

// rowHead is what the head bytes are made from. The model selection is cached only without
// options (a nil slice): its options would need a deep comparison.
type rowHead struct {
	id, projectID, title         string
	modelSet                     bool
	instance, model              string
	runtimeMode, interactionMode t3rpc.OptString
}

func headOf(s *t3rpc.ThreadShell) (rowHead, bool) {
	h := rowHead{
		id: s.ID, projectID: s.ProjectId, title: s.Title,
		modelSet: s.ModelSelection.Set, runtimeMode: s.RuntimeMode, interactionMode: s.InteractionMode,
	}
	if s.ModelSelection.Set {
		if s.ModelSelection.Value.Options != nil {
			return h, false
		}
		h.instance, h.model = s.ModelSelection.Value.InstanceId, s.ModelSelection.Value.Model
	}
	return h, true
}

// encodeHead writes the fields id … interactionMode as t3rpc.ThreadShell.Encode does.
func encodeHead(e *jx.Encoder, s *t3rpc.ThreadShell) {
	e.FieldStart("id")
	e.Str(s.ID)
	e.FieldStart("projectId")
	e.Str(s.ProjectId)
	e.FieldStart("title")
	e.Str(s.Title)
	if s.ModelSelection.Set {
		e.FieldStart("modelSelection")
		s.ModelSelection.Encode(e)
	}
	if s.RuntimeMode.Set {
		e.FieldStart("runtimeMode")
		s.RuntimeMode.Encode(e)
	}
	if s.InteractionMode.Set {
		e.FieldStart("interactionMode")
		s.InteractionMode.Encode(e)
	}
}

// headBytes is the head fields of s (`"id":…,"interactionMode":…`), from the cache when they
// have not changed.
func (rc *rowCache) headBytes(s *t3rpc.ThreadShell) []byte {
	key, ok := headOf(s)
	if ok && rc.head != nil && key == rc.headKey {
		return rc.head
	}
	sc := &rc.scratch
	sc.Reset()
	if ok {
		sc.SetBytes(rc.head[:0])
	}
	sc.ObjStart()
	encodeHead(sc, s)
	b := sc.Bytes()
	sc.SetBytes(nil)
	// `{"id":…}` without its brace: several fields, written as one raw part.
	if ok {
		rc.head, rc.headKey = b[1:], key
	}
	return b[1:]
}

// runIDBytes is a run id field's value (latestRunId, activeRunId).
func (rc *rowCache) runIDBytes(v t3rpc.OptNilString) []byte {
	if v.Null {
		return nullBytes
	}
	if rc.run == nil || v.Value != rc.runKey {
		w := &rc.runIDw
		w.Buf = rc.run[:0]
		w.Str(v.Value)
		rc.run, rc.runKey = w.Buf, v.Value
		w.Buf = nil
	}
	return rc.run
}

// visibleMessageBytes is latestVisibleMessage's value.
func (rc *rowCache) visibleMessageBytes(v t3rpc.OptNilVisibleMessage) []byte {
	if v.Null {
		return nullBytes
	}
	if rc.lvm == nil || v != rc.lvmKey {
		sc := &rc.scratch
		sc.Reset()
		sc.SetBytes(rc.lvm[:0])
		v.Encode(sc)
		rc.lvm, rc.lvmKey = sc.Bytes(), v
		sc.SetBytes(nil)
	}
	return rc.lvm
}

var nullBytes = []byte("null")

// fields writes an object's fields with their keys as literals: jx's FieldStart escapes every
// key and tracks commas for every field, which was half of a row's encoding.
type fields struct {
	w jx.Writer
	n int // fields written
}

// key starts a field; lit is the key with its quotes and colon (`"status":`).
func (f *fields) key(lit string) {
	if f.n > 0 {
		f.w.Buf = append(f.w.Buf, ',')
	}
	f.n++
	f.w.Buf = append(f.w.Buf, lit...)
}

func (f *fields) raw(lit string, v []byte) {
	f.key(lit)
	f.w.Buf = append(f.w.Buf, v...)
}

func (f *fields) str(lit, v string) {
	f.key(lit)
	f.w.Str(v)
}

// optStr writes an optional string field when set.
func (f *fields) optStr(lit string, v t3rpc.OptString) {
	if v.Set {
		f.str(lit, v.Value)
	}
}

// optNilStr writes an optional, nullable string field when set.
func (f *fields) optNilStr(lit string, v t3rpc.OptNilString) {
	switch {
	case !v.Set:
	case v.Null:
		f.raw(lit, nullBytes)
	default:
		f.str(lit, v.Value)
	}
}

// value writes a field whose value the generated encoder writes, through sc.
func (f *fields) value(lit string, sc *jx.Encoder, v encoder) {
	f.key(lit)
	sc.Reset()
	sc.SetBytes(f.w.Buf)
	v.Encode(sc)
	f.w.Buf = sc.Bytes()
	sc.SetBytes(nil)
}

// appendRow appends the shell stream item thread.updated for s at seq and location, byte for
// byte what t3rpc.ShellStreamItem{Kind, Sequence, Location, Thread}.Encode writes: the thread's
// fields in the order of t3rpc.ThreadShell.Encode, with the repeating parts from rc.
// TestShellRowsMatchGenerated and TestShellRowCacheFollowsChanges pin the bytes.
func (rc *rowCache) appendRow(buf []byte, seq int64, location string, s *t3rpc.ThreadShell) []byte {
	buf = append(buf, `{"kind":"thread.updated","sequence":`...)
	buf = strconv.AppendInt(buf, seq, 10)
	f := &rc.fw
	f.w.Buf, f.n = buf, 1
	f.str(`"location":`, location)
	f.key(`"thread":{`)
	f.n = 0
	f.optNilStr(`"branch":`, s.Branch)
	f.optNilStr(`"worktreePath":`, s.WorktreePath)
	f.raw("", rc.headBytes(s))
	f.str(`"status":`, s.Status)
	if s.LatestRunId.Set {
		f.raw(`"latestRunId":`, rc.runIDBytes(s.LatestRunId))
	}
	if s.ActiveRunId.Set {
		f.raw(`"activeRunId":`, rc.runIDBytes(s.ActiveRunId))
	}
	f.optNilStr(`"latestRunRequestedAt":`, s.LatestRunRequestedAt)
	f.optNilStr(`"latestRunStartedAt":`, s.LatestRunStartedAt)
	f.optNilStr(`"latestRunCompletedAt":`, s.LatestRunCompletedAt)
	f.optNilStr(`"activityRunStatus":`, s.ActivityRunStatus)
	if len(s.LastError) != 0 {
		f.raw(`"lastError":`, s.LastError)
	}
	switch p := &s.PendingRuntimeRequest; {
	case !p.Set:
	case p.Null:
		f.raw(`"pendingRuntimeRequest":`, nullBytes)
	default:
		f.value(`"pendingRuntimeRequest":`, &rc.scratch, &p.Value)
	}
	if s.LatestVisibleMessage.Set {
		f.raw(`"latestVisibleMessage":`, rc.visibleMessageBytes(s.LatestVisibleMessage))
	}
	if s.ItemCount.Set {
		f.key(`"itemCount":`)
		f.w.Buf = strconv.AppendInt(f.w.Buf, s.ItemCount.Value, 10)
	}
	f.optStr(`"createdAt":`, s.CreatedAt)
	f.optStr(`"updatedAt":`, s.UpdatedAt)
	f.optNilStr(`"archivedAt":`, s.ArchivedAt)
	f.optNilStr(`"deletedAt":`, s.DeletedAt)
	buf = append(f.w.Buf, '}', '}')
	f.w.Buf = nil // the row's bytes are the slab's
	return buf
}

// rowsOf is the row cache for th's next row: its own while a run is active (taken from the
// server's free list) or while it still has one, the server's spare one otherwise. Callers hold
// Server.mu.
func (s *Server) rowsOf(th *thread) *rowCache {
	if th.rows != nil {
		return th.rows
	}
	if th.active == nil {
		return &s.spareRows
	}
	if n := len(s.freeRows); n > 0 {
		th.rows = s.freeRows[n-1]
		s.freeRows[n-1] = nil
		s.freeRows = s.freeRows[:n-1]
	} else {
		th.rows = &rowCache{}
	}
	return th.rows
}

// maxFreeRows bounds the free list of row caches. Under load a machine has a few runs active at
// a time (5,000 runs/s over 100 machines, ~35 ms each: two), but seeding starts a run on every
// thread at once: an unbounded list kept a cache per seeded thread for good, 7 % of the load
// harness's live heap, which every collection marks.
const maxFreeRows = 64

// releaseRows gives an idle thread's row cache back to the free list: the next run has another
// id and another message, and under load most threads are idle at any time. Past maxFreeRows
// the cache is left to the GC.
func (s *Server) releaseRows(th *thread) {
	if th.active == nil && th.rows != nil {
		if len(s.freeRows) < maxFreeRows {
			s.freeRows = append(s.freeRows, th.rows)
		}
		th.rows = nil
	}
}
