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
//   - a row holds no pointer: its strings are spans of its table's arena (rowTable), so the
//     collector's mark skips the rows, the arena and the id index as the few objects they are
//     instead of walking four objects and a dozen pointers per thread (BenchmarkMarkRows100x1000);
//   - timestamps in T3's format (2006-01-02T15:04:05.000Z) are kept as Unix milliseconds and
//     formatted again when read, which gives back the same string; any other string is kept
//     verbatim in the row's extra (odd);
//   - strings of a small set (project id, status, runtime and interaction mode, activity status)
//     share one span of the arena per table; model selections without options share one entry
//     of the table's models;
//   - an active run id equal to the latest run id shares its span;
//   - which optional fields were absent, null or set is two bits each;
//   - what few rows have and most do not (a pending request, odd stamps, a lastError other than
//     null, a branch or worktree, a model with options) is in the table's extra map, only for
//     the rows that have it.
//
// TestRowRoundTrip checks that every kept field reads back as it was decoded.
type row struct {
	id, title, projectID, status   span
	runtimeMode, interactionMode   span
	activity, latestRun, activeRun span
	model                          uint32 // 1 + index in rowTable.models; 0: none, or in the extra
	states                         uint32 // optState per optional field, 2 bits each
	itemCount                      int64
	stamps                         [nStamps]int64
	// seq is the sequence of the item that brought the row (a snapshot's
	// snapshotSequence): T3 gives a thread's row the sequence of its newest
	// event, so a thread subscription whose cursor has reached seq shows at
	// least what the row shows (Watcher.ThreadAt).
	seq     int64
	flags   uint8 // rowLive, rowHasExtra, lastError and workspace kinds
	oddMask uint8 // which stamps are in the extra's odd
}

const (
	rowLive     = 1 << iota // the slot holds a thread (free slots are zero)
	rowHasExtra             // the table's extra map has an entry for the slot
	lastErrorNull
	lastErrorExtra // lastError is neither absent nor null: in the extra
	wsNull         // branch and worktreePath both null (nearly every thread not on a worktree)
	wsExtra        // branch and worktreePath otherwise set: in the extra
)

// rowExtra is the pointerful part of the few rows that have one (rowHasExtra).
type rowExtra struct {
	pending   t3rpc.PendingRuntimeRequest
	lastError jx.Raw
	odd       [nStamps]string // stamps not in T3's format, verbatim
	branch    t3rpc.OptNilString
	worktree  t3rpc.OptNilString
	model     t3rpc.ModelSelection // when not shared (row.model == 0)
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

// nullRaw is the lastError of nearly every row.
var nullRaw = jx.Raw("null")

// stamp formats stamp i from its milliseconds (a stamp in T3's format; rowTable.stamp reads
// the odd ones).
func (r *row) stamp(i int) string {
	return time.UnixMilli(r.stamps[i]).UTC().Format(isoMillis)
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
