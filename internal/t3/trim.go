package t3

import (
	"bytes"
	"errors"
	"io"
	"slices"

	"github.com/go-faster/jx"
)

// Keep says which part of a bounded thread read (GET …/threads/{id}/bounded)
// a caller needs. T3's bounded body windows only the timeline rows: it
// carries every run, message, checkpoint and runtime request of the thread,
// so it grows with the thread's history (1.6 MiB at 5,000 turn items, 16 MiB
// at 50,000). A read with a Keep decodes only the runs the caller names and
// what belongs to them; the rest is skipped without being decoded.
//
// What is kept: the newest Runs runs by ordinal, the runs named in RunIDs,
// the runs T3 made of the user messages in MessageIDs; the messages and
// checkpoints of the kept runs (and those the kept runs point at); the
// runtime requests in RequestIDs and every pending one; every timeline row
// and the thread itself, as T3 sent them.
type Keep struct {
	Runs       int // the newest runs by ordinal; at least 1
	RunIDs     []string
	MessageIDs []string
	RequestIDs []string
}

// trimBounded rewrites a bounded thread body to the part k keeps, in the
// same shape (a BoundedThreadSnapshot, keys in T3's order), and returns how
// many runs the thread has in all. It never decodes a skipped element: each
// array element is scanned for the few keys that decide (ids, ordinal,
// status) and copied as raw bytes when kept. An error means body is not a
// JSON object of that shape; the caller then decodes the body as it came.
func trimBounded(body []byte, k Keep) (out []byte, runs int, err error) {
	d := jx.DecodeBytes(body)
	if d.Next() != jx.Object {
		return nil, 0, errors.New("bounded body: not an object")
	}
	t := trimmer{k: k, sub: jx.GetDecoder()}
	defer jx.PutDecoder(t.sub)
	e := &jx.Encoder{}
	e.Grow(len(body) / 8)
	e.ObjStart()
	err = d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		raw, err := d.Raw()
		if err != nil {
			return err
		}
		e.FieldStart(string(key))
		if string(key) != "projection" {
			e.Raw(raw)
			return nil
		}
		return t.projection(e, raw)
	})
	if err != nil {
		return nil, 0, err
	}
	if err := d.Skip(); err != io.EOF {
		return nil, 0, errors.New("bounded body: trailing data")
	}
	e.ObjEnd()
	return e.Bytes(), t.runs, nil
}

type trimmer struct {
	k    Keep
	sub  *jx.Decoder // scans one element at a time (reused: no allocation per element)
	runs int

	// Of the kept runs: their ids, the user messages they were made of, the
	// checkpoints they point at.
	runIDs, msgIDs, checkpointIDs map[string]bool
}

// projection writes the trimmed projection object. The runs decide what else
// is kept, and T3 may send them after the messages: every field is taken as
// raw bytes first (one skip over the body), then written in its order.
func (t *trimmer) projection(e *jx.Encoder, raw []byte) error {
	type field struct {
		key string
		raw []byte
	}
	var fields []field
	d := jx.DecodeBytes(raw)
	if d.Next() != jx.Object {
		return errors.New("bounded body: projection is not an object")
	}
	err := d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		v, err := d.Raw()
		fields = append(fields, field{string(key), v})
		return err
	})
	if err != nil {
		return err
	}
	t.runIDs, t.msgIDs, t.checkpointIDs = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, f := range fields {
		if f.key == "runs" {
			kept, err := t.keepRuns(f.raw)
			if err != nil {
				return err
			}
			f.raw = kept
		}
	}
	for _, id := range t.k.MessageIDs {
		t.msgIDs[id] = true
	}
	e.ObjStart()
	for _, f := range fields {
		e.FieldStart(f.key)
		var err error
		switch f.key {
		case "runs":
			err = t.writeRuns(e, f.raw)
		case "messages":
			err = t.filter(e, f.raw, func(id, runID, _ []byte) bool {
				return t.runIDs[string(runID)] || t.msgIDs[string(id)]
			})
		case "checkpoints":
			err = t.filter(e, f.raw, func(id, runID, _ []byte) bool {
				return t.runIDs[string(runID)] || t.checkpointIDs[string(id)]
			})
		case "runtimeRequests":
			err = t.filter(e, f.raw, func(id, _, status []byte) bool {
				return string(status) == "pending" || contains(t.k.RequestIDs, id)
			})
		default:
			e.Raw(f.raw)
		}
		if err != nil {
			return err
		}
	}
	e.ObjEnd()
	return nil
}

// run is a run element as scanned: where it sits, its ordinal, and whether a
// Keep names it.
type run struct {
	raw     []byte
	ordinal int64
	named   bool
}

// keepRuns scans the runs array and returns it unchanged; it records in t
// which runs are kept (the newest k.Runs, the named ones) and what they point
// at. The kept elements are written by writeRuns, in T3's order.
func (t *trimmer) keepRuns(raw []byte) ([]byte, error) {
	n := max(1, t.k.Runs)
	var newest []run // the n newest so far, by ordinal ascending
	var named []run
	d := jx.DecodeBytes(raw)
	if d.Next() != jx.Array {
		return nil, errors.New("bounded body: runs is not an array")
	}
	err := d.Arr(func(d *jx.Decoder) error {
		r, err := d.Raw()
		if err != nil {
			return err
		}
		t.runs++
		el := run{raw: r}
		err = t.scan(r, func(key []byte, d *jx.Decoder) error {
			switch string(key) {
			case "ordinal":
				if d.Next() != jx.Number {
					return d.Skip()
				}
				v, err := d.Int64()
				el.ordinal = v
				return err
			case "id":
				s, ok, err := str(d)
				if ok && contains(t.k.RunIDs, s) {
					el.named = true
				}
				return err
			case "userMessageId":
				s, ok, err := str(d)
				if ok && contains(t.k.MessageIDs, s) {
					el.named = true
				}
				return err
			}
			return d.Skip()
		})
		if err != nil {
			return err
		}
		switch {
		case el.named:
			named = append(named, el)
		case len(newest) < n || el.ordinal > newest[0].ordinal:
			i, _ := slices.BinarySearchFunc(newest, el.ordinal, func(r run, o int64) int {
				switch {
				case r.ordinal < o:
					return -1
				case r.ordinal > o:
					return 1
				}
				return 0
			})
			newest = slices.Insert(newest, i, el)
			if len(newest) > n {
				newest = newest[1:]
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, r := range append(newest, named...) {
		if err := t.note(r.raw); err != nil {
			return nil, err
		}
	}
	return raw, nil
}

// note records a kept run's id and what it points at.
func (t *trimmer) note(raw []byte) error {
	return t.scan(raw, func(key []byte, d *jx.Decoder) error {
		var into map[string]bool
		switch string(key) {
		case "id":
			into = t.runIDs
		case "userMessageId":
			into = t.msgIDs
		case "checkpointId":
			into = t.checkpointIDs
		default:
			return d.Skip()
		}
		s, ok, err := str(d)
		if ok {
			into[string(s)] = true
		}
		return err
	})
}

// writeRuns writes the kept runs, in T3's order.
func (t *trimmer) writeRuns(e *jx.Encoder, raw []byte) error {
	return t.filter(e, raw, func(id, _, _ []byte) bool { return t.runIDs[string(id)] })
}

// filter writes the array raw with the elements keep accepts, judged by
// their "id", "runId" and "status" strings (nil when absent or not a string).
func (t *trimmer) filter(e *jx.Encoder, raw []byte, keep func(id, runID, status []byte) bool) error {
	d := jx.DecodeBytes(raw)
	if d.Next() != jx.Array {
		return errors.New("bounded body: not an array where one was expected")
	}
	e.ArrStart()
	var id, runID, status []byte
	err := d.Arr(func(d *jx.Decoder) error {
		r, err := d.Raw()
		if err != nil {
			return err
		}
		id, runID, status = id[:0], runID[:0], status[:0]
		err = t.scan(r, func(key []byte, d *jx.Decoder) error {
			var into *[]byte
			switch string(key) {
			case "id":
				into = &id
			case "runId":
				into = &runID
			case "status":
				into = &status
			default:
				return d.Skip()
			}
			s, ok, err := str(d)
			if ok {
				*into = append(*into, s...) // the decoder's bytes are valid until its next call
			}
			return err
		})
		if err != nil {
			return err
		}
		if keep(id, runID, status) {
			e.Raw(r)
		}
		return nil
	})
	e.ArrEnd()
	return err
}

// scan calls fn for every key of the object raw, with the decoder at its
// value (fn must consume it).
func (t *trimmer) scan(raw []byte, fn func(key []byte, d *jx.Decoder) error) error {
	t.sub.ResetBytes(raw)
	if t.sub.Next() != jx.Object {
		return errors.New("bounded body: an element is not an object")
	}
	return t.sub.ObjBytes(func(d *jx.Decoder, key []byte) error { return fn(key, d) })
}

// contains reports whether b is one of ids (without converting b).
func contains(ids []string, b []byte) bool {
	for _, id := range ids {
		if id == string(b) {
			return true
		}
	}
	return false
}

// str reads a string value (ok false, and the value skipped, for null or any
// other type). The bytes are valid until the decoder's next call.
func str(d *jx.Decoder) ([]byte, bool, error) {
	if d.Next() != jx.String {
		return nil, false, d.Skip()
	}
	s, err := d.StrBytes()
	return s, err == nil, err
}

// readBody reads a response body into a buffer of its announced length (an
// io.ReadAll would grow one several times for a body of megabytes).
func readBody(r io.Reader, length int64) ([]byte, error) {
	var b bytes.Buffer
	if length > 0 && length < 256<<20 {
		b.Grow(int(length) + bytes.MinRead)
	}
	_, err := b.ReadFrom(r)
	return b.Bytes(), err
}
