package t3fake

import (
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
// field in the order of t3rpc.ThreadShell.Encode; TestShellRowsMatchGenerated and
// TestShellRowCacheFollowsChanges pin the bytes to the generated encoder's.

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

// writeHead writes the head fields of s, from the cache when they have not changed.
func (rc *rowCache) writeHead(e *jx.Encoder, s *t3rpc.ThreadShell) {
	key, ok := headOf(s)
	if !ok {
		encodeHead(e, s)
		return
	}
	if rc.head == nil || key != rc.headKey {
		sc := &rc.scratch
		sc.Reset()
		sc.SetBytes(rc.head[:0])
		sc.ObjStart()
		encodeHead(sc, s)
		b := sc.Bytes()
		// `{"id":…}` without its braces: several fields, written as one raw value, which the
		// encoder separates from the field before it with a comma as it would the first field.
		rc.head, rc.headKey = b[1:], key
		sc.SetBytes(nil)
	}
	e.Raw(rc.head)
}

// writeRunID writes a run id field's value (latestRunId, activeRunId).
func (rc *rowCache) writeRunID(e *jx.Encoder, v t3rpc.OptNilString) {
	if v.Null {
		e.Null()
		return
	}
	if rc.run == nil || v.Value != rc.runKey {
		w := jx.Writer{Buf: rc.run[:0]}
		w.Str(v.Value)
		rc.run, rc.runKey = w.Buf, v.Value
	}
	e.Raw(rc.run)
}

// writeVisibleMessage writes latestVisibleMessage's value.
func (rc *rowCache) writeVisibleMessage(e *jx.Encoder, v t3rpc.OptNilVisibleMessage) {
	if v.Null {
		e.Null()
		return
	}
	if rc.lvm == nil || v != rc.lvmKey {
		sc := &rc.scratch
		sc.Reset()
		sc.SetBytes(rc.lvm[:0])
		v.Encode(sc)
		rc.lvm, rc.lvmKey = sc.Bytes(), v
		sc.SetBytes(nil)
	}
	e.Raw(rc.lvm)
}

// encodeShell writes s as t3rpc.ThreadShell.Encode does, field for field in its order, with
// the repeating parts from rc.
func (rc *rowCache) encodeShell(e *jx.Encoder, s *t3rpc.ThreadShell) {
	e.ObjStart()
	if s.Branch.Set {
		e.FieldStart("branch")
		s.Branch.Encode(e)
	}
	if s.WorktreePath.Set {
		e.FieldStart("worktreePath")
		s.WorktreePath.Encode(e)
	}
	rc.writeHead(e, s)
	e.FieldStart("status")
	e.Str(s.Status)
	if s.LatestRunId.Set {
		e.FieldStart("latestRunId")
		rc.writeRunID(e, s.LatestRunId)
	}
	if s.ActiveRunId.Set {
		e.FieldStart("activeRunId")
		rc.writeRunID(e, s.ActiveRunId)
	}
	if s.LatestRunRequestedAt.Set {
		e.FieldStart("latestRunRequestedAt")
		s.LatestRunRequestedAt.Encode(e)
	}
	if s.LatestRunStartedAt.Set {
		e.FieldStart("latestRunStartedAt")
		s.LatestRunStartedAt.Encode(e)
	}
	if s.LatestRunCompletedAt.Set {
		e.FieldStart("latestRunCompletedAt")
		s.LatestRunCompletedAt.Encode(e)
	}
	if s.ActivityRunStatus.Set {
		e.FieldStart("activityRunStatus")
		s.ActivityRunStatus.Encode(e)
	}
	if len(s.LastError) != 0 {
		e.FieldStart("lastError")
		e.Raw(s.LastError)
	}
	if s.PendingRuntimeRequest.Set {
		e.FieldStart("pendingRuntimeRequest")
		s.PendingRuntimeRequest.Encode(e)
	}
	if s.LatestVisibleMessage.Set {
		e.FieldStart("latestVisibleMessage")
		rc.writeVisibleMessage(e, s.LatestVisibleMessage)
	}
	if s.ItemCount.Set {
		e.FieldStart("itemCount")
		s.ItemCount.Encode(e)
	}
	if s.CreatedAt.Set {
		e.FieldStart("createdAt")
		s.CreatedAt.Encode(e)
	}
	if s.UpdatedAt.Set {
		e.FieldStart("updatedAt")
		s.UpdatedAt.Encode(e)
	}
	if s.ArchivedAt.Set {
		e.FieldStart("archivedAt")
		s.ArchivedAt.Encode(e)
	}
	if s.DeletedAt.Set {
		e.FieldStart("deletedAt")
		s.DeletedAt.Encode(e)
	}
	e.ObjEnd()
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

// releaseRows gives an idle thread's row cache back to the free list: the next run has another
// id and another message, and under load most threads are idle at any time.
func (s *Server) releaseRows(th *thread) {
	if th.active == nil && th.rows != nil {
		s.freeRows = append(s.freeRows, th.rows)
		th.rows = nil
	}
}
