package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/go-faster/jx"
	bolt "go.etcd.io/bbolt"
)

// An event's header is stored as the JSON object encoding/json makes of Event (its field tags),
// written and read here with jx: every delivery's record reads a header and writes it again, and
// every commit writes one, where encoding/json's reflection cost 2.3 % of the throughput phase's
// samples (decode 1.1, encode 1.2). It is the JSON encoding/json writes (the same fields in the
// same order, left out when empty, HTML characters and invalid UTF-8 escaped the same way, times
// in RFC 3339 with nanoseconds; only a control character may be escaped as \u000c where it
// writes \f), so files written before and after read the same with either (FuzzHeader).

// An event's record (schema 5: the value under its sequence number in ev_pending, ev_dead or
// ev_delivered) is its header and its body in one value: the header's length (4 bytes
// big-endian), the header, then the body raw. A commit then writes one value per event into one
// bucket where it wrote two values into two (the header, and the body into ev_bodies): every
// transaction reads, grows and writes one B-tree path fewer (the tail of ev_bodies, the largest
// bucket, its leaf and its branch nodes materialized in memory each time: ~5 kB of a small
// transaction's ~31 kB per event, BenchmarkGroupCommitPerEventFew). The cost: a change of state
// (a delivery moving the record to ev_delivered, a retry rewriting it) writes the body again, so
// transactions of deliveries alone (a backlog's drain) allocate more per event than before
// (BenchmarkRecord256BySeq ~3.8 → ~5.0 kB), while a commit's and a delivery's, together or not,
// cost fewer pages and bytes per event (docs/benchmarks.md, issue 12, store 12-03).

// recordLen is the size of a record's header length.
const recordLen = 4

// putRecord stores e's record, with body, under its sequence number in b.
func putRecord(b *bolt.Bucket, e Event, body []byte) error {
	rec, err := encodeRecord(e, body)
	if err != nil {
		return err
	}
	return b.Put(seqKey(e.Seq), rec)
}

// encodeRecord is e's record with body (a new slice: bbolt keeps it until the commit).
func encodeRecord(e Event, body []byte) ([]byte, error) {
	var w jx.Writer
	w.Buf = make([]byte, recordLen, recordLen+224+len(e.ID)+len(e.Stream)+len(e.LastError)+len(body))
	if err := appendHeader(&w, e); err != nil {
		return nil, err
	}
	n := len(w.Buf) - recordLen
	if n > bolt.MaxValueSize {
		return nil, fmt.Errorf("store: event %q: header too large", e.ID)
	}
	binary.BigEndian.PutUint32(w.Buf, uint32(n))
	return append(w.Buf, body...), nil
}

// decodeRecord reads the record stored under key k: its header and its body (a part of v, so
// bbolt's memory when v is: valid only inside the transaction).
func decodeRecord(k, v []byte) (Event, []byte, error) {
	if len(v) < recordLen {
		return Event{}, nil, errors.New("store: corrupt event record: too short")
	}
	n := binary.BigEndian.Uint32(v)
	if uint64(n) > uint64(len(v)-recordLen) {
		return Event{}, nil, errors.New("store: corrupt event record: header length past its end")
	}
	e, err := decodeHeader(k, v[recordLen:recordLen+n])
	if err != nil {
		return Event{}, nil, err
	}
	return e, v[recordLen+n:], nil
}

// putHeader stores e's header alone under its sequence number in b: the record of schemas 2–4
// (the body in ev_bodies), which the migrations from schema 1 write before the one to schema 5
// joins them.
func putHeader(b *bolt.Bucket, e Event) error {
	var w jx.Writer
	w.Buf = make([]byte, 0, 256)
	if err := appendHeader(&w, e); err != nil {
		return err
	}
	return b.Put(seqKey(e.Seq), w.Buf)
}

// appendHeader writes e's header (Body and Seq are not part of it).
func appendHeader(w *jx.Writer, e Event) error {
	w.ObjStart()
	w.RawStr(`"id":`)
	w.StrEscape(e.ID)
	w.RawStr(`,"stream":`)
	w.StrEscape(e.Stream)
	if e.Enrich {
		w.RawStr(`,"enrich":true`)
	}
	if err := timeField(w, `,"createdAt":`, e.CreatedAt); err != nil {
		return err
	}
	if err := timeField(w, `,"enqueuedAt":`, e.EnqueuedAt); err != nil {
		return err
	}
	w.RawStr(`,"state":`)
	w.StrEscape(e.State)
	w.RawStr(`,"attempts":`)
	w.Int(e.Attempts)
	if !e.NextAttempt.IsZero() {
		if err := timeField(w, `,"nextAttempt":`, e.NextAttempt); err != nil {
			return err
		}
	}
	if e.LastError != "" {
		w.RawStr(`,"lastError":`)
		w.StrEscape(e.LastError)
	}
	if !e.DeliveredAt.IsZero() {
		if err := timeField(w, `,"deliveredAt":`, e.DeliveredAt); err != nil {
			return err
		}
	}
	if !e.DeadAt.IsZero() {
		if err := timeField(w, `,"deadAt":`, e.DeadAt); err != nil {
			return err
		}
	}
	w.ObjEnd()
	return nil
}

// timeField writes key and t as time.Time's MarshalJSON does (and fails where it does: a year
// outside 0–9999).
func timeField(w *jx.Writer, key string, t time.Time) error {
	if y := t.Year(); y < 0 || y >= 10000 {
		return fmt.Errorf("store: event time %v: year outside [0,9999]", y)
	}
	w.RawStr(key)
	w.Buf = append(w.Buf, '"')
	w.Buf = t.AppendFormat(w.Buf, time.RFC3339Nano)
	w.Buf = append(w.Buf, '"')
	return nil
}

// decodeHeader reads the header stored under key k (a record's, or schemas 2–4's value).
func decodeHeader(k, v []byte) (Event, error) {
	var e Event
	d := jx.DecodeBytes(v)
	err := d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		if d.Next() == jx.Null { // encoding/json leaves the field as it is
			return d.Null()
		}
		var err error
		switch string(key) {
		case "id":
			e.ID, err = d.Str()
		case "stream":
			e.Stream, err = d.Str()
		case "enrich":
			e.Enrich, err = d.Bool()
		case "createdAt":
			e.CreatedAt, err = decodeTime(d)
		case "enqueuedAt":
			e.EnqueuedAt, err = decodeTime(d)
		case "state":
			e.State, err = d.Str()
		case "attempts":
			e.Attempts, err = d.Int()
		case "nextAttempt":
			e.NextAttempt, err = decodeTime(d)
		case "lastError":
			e.LastError, err = d.Str()
		case "deliveredAt":
			e.DeliveredAt, err = decodeTime(d)
		case "deadAt":
			e.DeadAt, err = decodeTime(d)
		default:
			err = d.Skip()
		}
		return err
	})
	if err != nil {
		return Event{}, fmt.Errorf("store: corrupt event record: %w", err)
	}
	e.Seq = binary.BigEndian.Uint64(k)
	return e, nil
}

// decodeTime reads a time as time.Time's UnmarshalJSON does (RFC 3339).
func decodeTime(d *jx.Decoder) (time.Time, error) {
	b, err := d.StrBytes()
	if err != nil {
		return time.Time{}, err
	}
	var t time.Time
	err = t.UnmarshalText(b)
	return t, err
}
