package watch

import (
	"errors"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// recentStrings gives a shell row's string fields the strings of the rows decoded just before
// it: a thread's consecutive rows (a run's eight steps) repeat nearly every string — its id,
// project, title, status, run ids, timestamps but updatedAt — and allocating each again was most
// of a row's decode (one allocation per field; the item decode is the largest single piece of a
// chunk's apply). Per field it keeps the last recentWays distinct values, so that the rows of the
// few threads a machine has underway at once find theirs; a value not among them is allocated as
// before. updatedAt, new in every row, is not looked up. A value is compared in full only when
// its length and last byte match (a run id or a timestamp differs from its neighbours at the
// end; comparing all of each was as dear as the allocation saved, in the load phase's profile).
// One per watcher, used by whichever goroutine applies its chunks (one chunk at a time).
type recentStrings struct {
	vals [nRecentFields][recentWays]string
	next [nRecentFields]uint8
	// dec decodes the items (decodeItem), reset for each: a new decoder per item was the largest
	// of a busy chunk's allocations (BenchmarkApplyChunkRunSteps).
	dec jx.Decoder
}

// decoder is a decoder of b: r's own (reset to b), or a new one when r is nil.
func (r *recentStrings) decoder(b []byte) *jx.Decoder {
	if r == nil {
		return jx.DecodeBytes(b)
	}
	r.dec.ResetBytes(b)
	return &r.dec
}

// letGo makes r's decoder let go of the bytes it decoded last.
func (r *recentStrings) letGo() {
	if r != nil {
		r.dec.ResetBytes(nil)
	}
}

// recentWays is how many values of each field are remembered.
const recentWays = 8

// The string fields of a shell row that recentStrings serves.
const (
	rsID = iota
	rsProjectID
	rsTitle
	rsStatus
	rsRuntimeMode
	rsInteractionMode
	rsLatestRun
	rsActiveRun
	rsRequestedAt
	rsStartedAt
	rsCompletedAt
	rsActivity
	rsCreatedAt
	rsArchivedAt
	rsDeletedAt
	rsBranch
	rsWorktree
	nRecentFields
)

// rsNone is a field not looked up (updatedAt).
const rsNone = -1

// str is b as a string: a remembered one when equal, else a new one, remembered.
func (r *recentStrings) str(field int, b []byte) string {
	if r == nil || len(b) == 0 || field == rsNone {
		return string(b)
	}
	vals := &r.vals[field]
	last := b[len(b)-1]
	for i := range vals {
		if v := vals[i]; len(v) == len(b) && v[len(v)-1] == last && v == string(b) {
			return v
		}
	}
	s := string(b)
	n := r.next[field]
	vals[n] = s
	r.next[field] = (n + 1) % recentWays
	return s
}

// decodeStr decodes a JSON string as d.Str does.
func (r *recentStrings) decodeStr(field int, d *jx.Decoder) (string, error) {
	v, err := d.StrBytes()
	if err != nil {
		return "", err
	}
	return r.str(field, v), nil
}

// decodeOpt decodes an optional string as t3rpc.OptString.Decode does.
func (r *recentStrings) decodeOpt(field int, o *t3rpc.OptString, d *jx.Decoder) error {
	*o = t3rpc.OptString{Set: true}
	v, err := r.decodeStr(field, d)
	o.Value = v
	return err
}

// decodeOptNil decodes an optional, nullable string as t3rpc.OptNilString.Decode does.
func (r *recentStrings) decodeOptNil(field int, o *t3rpc.OptNilString, d *jx.Decoder) error {
	if d.Next() == jx.Null {
		if err := d.Null(); err != nil {
			*o = t3rpc.OptNilString{}
			return err
		}
		*o = t3rpc.OptNilString{Set: true, Null: true}
		return nil
	}
	*o = t3rpc.OptNilString{Set: true}
	v, err := r.decodeStr(field, d)
	o.Value = v
	return err
}

var errShellRequired = errors.New("shell row without one of id, projectId, title, status")

// decodeShell decodes a shell row into t as t3rpc.ThreadShell.Decode does (FuzzDecodeItem checks
// that both give the same row or both an error), its string fields taken from rs (recentStrings);
// the other fields are decoded by the generated decoders of their types. t must be zero.
func decodeShell(d *jx.Decoder, t *t3rpc.ThreadShell, rs *recentStrings) error {
	const hasID, hasProject, hasTitle, hasStatus = 1, 2, 4, 8
	var required uint8
	err := d.ObjBytes(func(d *jx.Decoder, k []byte) error {
		var err error
		switch string(k) {
		case "id":
			required |= hasID
			t.ID, err = rs.decodeStr(rsID, d)
		case "projectId":
			required |= hasProject
			t.ProjectId, err = rs.decodeStr(rsProjectID, d)
		case "title":
			required |= hasTitle
			t.Title, err = rs.decodeStr(rsTitle, d)
		case "status":
			required |= hasStatus
			t.Status, err = rs.decodeStr(rsStatus, d)
		case "branch":
			err = rs.decodeOptNil(rsBranch, &t.Branch, d)
		case "worktreePath":
			err = rs.decodeOptNil(rsWorktree, &t.WorktreePath, d)
		case "runtimeMode":
			err = rs.decodeOpt(rsRuntimeMode, &t.RuntimeMode, d)
		case "interactionMode":
			err = rs.decodeOpt(rsInteractionMode, &t.InteractionMode, d)
		case "latestRunId":
			err = rs.decodeOptNil(rsLatestRun, &t.LatestRunId, d)
		case "activeRunId":
			err = rs.decodeOptNil(rsActiveRun, &t.ActiveRunId, d)
		case "latestRunRequestedAt":
			err = rs.decodeOptNil(rsRequestedAt, &t.LatestRunRequestedAt, d)
		case "latestRunStartedAt":
			err = rs.decodeOptNil(rsStartedAt, &t.LatestRunStartedAt, d)
		case "latestRunCompletedAt":
			err = rs.decodeOptNil(rsCompletedAt, &t.LatestRunCompletedAt, d)
		case "activityRunStatus":
			err = rs.decodeOptNil(rsActivity, &t.ActivityRunStatus, d)
		case "createdAt":
			err = rs.decodeOpt(rsCreatedAt, &t.CreatedAt, d)
		case "updatedAt":
			err = rs.decodeOpt(rsNone, &t.UpdatedAt, d)
		case "archivedAt":
			err = rs.decodeOptNil(rsArchivedAt, &t.ArchivedAt, d)
		case "deletedAt":
			err = rs.decodeOptNil(rsDeletedAt, &t.DeletedAt, d)
		case "modelSelection":
			t.ModelSelection.Reset()
			err = t.ModelSelection.Decode(d)
		case "lastError":
			var v []byte
			v, err = d.RawAppend(nil)
			t.LastError = jx.Raw(v)
		case "pendingRuntimeRequest":
			t.PendingRuntimeRequest.Reset()
			err = t.PendingRuntimeRequest.Decode(d)
		case "latestVisibleMessage":
			t.LatestVisibleMessage.Reset()
			err = t.LatestVisibleMessage.Decode(d)
		case "itemCount":
			t.ItemCount.Reset()
			err = t.ItemCount.Decode(d)
		default:
			return d.Skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	if required != hasID|hasProject|hasTitle|hasStatus {
		return errShellRequired
	}
	return nil
}
