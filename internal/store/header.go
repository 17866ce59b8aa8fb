package store

import (
	"encoding/binary"
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

// putHeader stores e's header under its sequence number in b.
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

// decodeHeader reads the header stored under key k.
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
