package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/go-faster/jx"
)

// The header codec (header.go) writes the bytes encoding/json wrote before it, and reads what
// encoding/json reads, so that state files written by either binary open with the other.
func FuzzHeader(f *testing.F) {
	now := time.Date(2026, 12, 2, 1, 2, 3, 456789000, time.UTC).UnixNano()
	f.Add("evt_0123", "load-007/thread-1", "pending", "", false, 0, now, now, int64(0), int64(0), int64(0), 0)
	f.Add("evt_<&>", "m/\u2028t", "delivered", "receiver: HTTP 503 \"x\"\t\xff", true, 3, now, now+1, now+2, now+3, int64(0), 3600)
	f.Add("", "", "dead", "expired", false, -1, int64(0), int64(-6213559680000000000), int64(1), int64(0), now, -19800)
	f.Fuzz(func(t *testing.T, id, stream, state, lastError string, enrich bool, attempts int, created, enqueued, next, delivered, dead int64, offset int) {
		zone := time.FixedZone("", offset%(26*3600))
		at := func(ns int64) time.Time {
			if ns == 0 {
				return time.Time{}
			}
			return time.Unix(0, ns).In(zone)
		}
		e := Event{ID: id, Stream: stream, State: state, LastError: lastError, Enrich: enrich, Attempts: attempts,
			CreatedAt: at(created), EnqueuedAt: at(enqueued), NextAttempt: at(next), DeliveredAt: at(delivered), DeadAt: at(dead)}
		old, oldErr := json.Marshal(e)
		var w jx.Writer
		newErr := appendHeader(&w, e)
		if (oldErr == nil) != (newErr == nil) {
			t.Fatalf("encoding/json: %v, appendHeader: %v", oldErr, newErr)
		}
		if oldErr != nil {
			return
		}
		// The same JSON (a control character may be escaped as \f or \u000c), read the same by
		// both decoders, whichever wrote it.
		var want, fromNew Event
		if err := json.Unmarshal(old, &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(w.Buf, &fromNew); err != nil {
			t.Fatalf("encoding/json cannot read %s: %v", w.Buf, err)
		}
		want.Seq = 42
		fromNew.Seq = 42
		if !reflect.DeepEqual(fromNew, want) {
			t.Fatalf("encoding/json read\n%s as %+v\nand\n%s as %+v", old, want, w.Buf, fromNew)
		}
		for _, b := range [][]byte{old, w.Buf} {
			got, err := decodeHeader(seqKey(42), b)
			if err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decodeHeader read %s as %+v, encoding/json as %+v", b, got, want)
			}
		}
	})
}

// A header encoding/json reads is read the same, fields in any order, unknown ones and nulls
// skipped; a broken one is an error naming the record as corrupt.
func TestDecodeHeaderReadsWhatEncodingJSONReads(t *testing.T) {
	for _, in := range []string{
		`{"stream":"m/t","id":"e1","unknown":{"a":[1,2]},"state":"pending","attempts":2,"createdAt":"2026-12-02T01:02:03.5+01:00","enqueuedAt":"2026-12-02T00:02:03Z","lastError":null}`,
		` {"id":"e2","stream":"m/t","enrich":true,"state":"pending","attempts":0,"createdAt":"0001-01-01T00:00:00Z","enqueuedAt":"0001-01-01T00:00:00Z"} `,
	} {
		got, err := decodeHeader(seqKey(7), []byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		var want Event
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		want.Seq = 7
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\ndecodeHeader %+v\nencoding/json %+v", in, got, want)
		}
	}
	for _, in := range []string{``, `[]`, `{"id":1}`, `{"createdAt":"yesterday"}`, `{"attempts":"2"}`} {
		if _, err := decodeHeader(seqKey(7), []byte(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// Whatever bytes a state file holds where a header should be, reading them fails or gives an
// event, never a panic; what it gives is written back as valid JSON.
func FuzzDecodeHeader(f *testing.F) {
	f.Add([]byte(`{"id":"e1","stream":"m/t","state":"pending","attempts":2,"createdAt":"2026-12-02T01:02:03.5+01:00","enqueuedAt":"2026-12-02T00:02:03Z"}`))
	f.Add([]byte(`{"id":"e2","stream":"m/t","enrich":true,"state":"delivered","attempts":1,"createdAt":"0001-01-01T00:00:00Z","enqueuedAt":"0001-01-01T00:00:00Z","deliveredAt":"2026-12-02T00:02:03Z","lastError":"x"}`))
	f.Add([]byte(`{"id":null,"x":[{"y":"\u0000"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := decodeHeader(seqKey(1), data)
		if err != nil {
			return
		}
		var w jx.Writer
		if appendHeader(&w, e) == nil && !json.Valid(w.Buf) {
			t.Fatalf("%s read as %+v, written back as invalid JSON %s", data, e, w.Buf)
		}
	})
}

// The header codec is written field by field: a field added to Event and not to header.go would
// be dropped from every state file without an error. Every field the header carries (all but
// Body and Seq, tagged "-") is set here and must come back.
func TestHeaderCodecCarriesEveryEventField(t *testing.T) {
	var e Event
	setEveryField(t, &e, "appendHeader, decodeHeader")
	var w jx.Writer
	if err := appendHeader(&w, e); err != nil {
		t.Fatal(err)
	}
	got, err := decodeHeader(seqKey(9), w.Buf)
	if err != nil {
		t.Fatalf("%s: %v", w.Buf, err)
	}
	e.Seq = 9
	if !reflect.DeepEqual(got, e) {
		t.Fatalf("a header written and read back lost fields:\nwrote %+v\nread  %+v\n(%s)", e, got, w.Buf)
	}
}

// setEveryField sets every JSON field of the struct *p (not those tagged "-") to a value of its
// own, failing on a field type it does not know: the codec named by codec must learn it.
func setEveryField(t *testing.T, p any, codec string) {
	t.Helper()
	v := reflect.ValueOf(p).Elem()
	at := time.Date(2026, 12, 2, 4, 5, 6, 7, time.UTC)
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		if sf.Tag.Get("json") == "-" {
			continue
		}
		switch f.Interface().(type) {
		case string:
			f.SetString(sf.Name + "-value")
		case bool:
			f.SetBool(true)
		case int:
			f.SetInt(int64(i + 1))
		case time.Time:
			f.Set(reflect.ValueOf(at.Add(time.Duration(i) * time.Second)))
		default:
			t.Fatalf("%s.%s is a %s: teach %s and this test about it", v.Type().Name(), sf.Name, sf.Type, codec)
		}
	}
}

// A record is the header and the body in one value: both come back as written, whatever bytes
// the body holds (it is stored raw), and the header carries every field.
func TestRecordCarriesHeaderAndBody(t *testing.T) {
	var e Event
	setEveryField(t, &e, "encodeRecord, decodeRecord")
	for _, body := range [][]byte{[]byte(`{"type":"thread.completed","text":"{\"nested\":1}"}`), []byte(`{}`), bytes.Repeat([]byte("x"), 70000)} {
		rec, err := encodeRecord(e, body)
		if err != nil {
			t.Fatal(err)
		}
		got, gotBody, err := decodeRecord(seqKey(9), rec)
		if err != nil {
			t.Fatalf("%.80s: %v", rec, err)
		}
		want := e
		want.Seq = 9
		if !reflect.DeepEqual(got, want) || !bytes.Equal(gotBody, body) {
			t.Fatalf("a record written and read back changed:\nwrote %+v body %.40s\nread  %+v body %.40s", want, body, got, gotBody)
		}
	}
	for _, bad := range []string{"", "\x00\x00\x00", "\x00\x00\x00\x05{}", "{\"id\":\"e\"}"} {
		if _, _, err := decodeRecord(seqKey(1), []byte(bad)); err == nil {
			t.Errorf("decodeRecord(%q) read a record", bad)
		}
	}
}

// Whatever bytes a state file holds where a record should be, reading them fails or gives an
// event and a body that are the value's parts, never a panic; what it gives is written back as
// the same record.
func FuzzDecodeRecord(f *testing.F) {
	for _, h := range []string{`{"id":"e1","stream":"m/t","state":"pending","attempts":2,"createdAt":"2026-12-02T01:02:03.5+01:00","enqueuedAt":"2026-12-02T00:02:03Z"}`, `{}`} {
		rec := binary.BigEndian.AppendUint32(nil, uint32(len(h)))
		f.Add(append(append(rec, h...), `{"type":"thread.completed"}`...))
	}
	f.Add([]byte("\xff\xff\xff\xff{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, body, err := decodeRecord(seqKey(1), data)
		if err != nil {
			return
		}
		if len(body) > len(data)-recordLen || !bytes.HasSuffix(data, body) {
			t.Fatalf("%q: body %q is not the value's tail", data, body)
		}
		rec, err := encodeRecord(e, body)
		if err != nil {
			return // a time the header cannot hold (as encoding/json refuses it)
		}
		e2, body2, err := decodeRecord(seqKey(1), rec)
		if err != nil || !bytes.Equal(body2, body) {
			t.Fatalf("%q read as %+v, written back as %q, read again as %+v (%v)", data, e, rec, e2, err)
		}
		// Compared as written again, twice: a time's zone reads back as another *Location of
		// the same offset, and invalid UTF-8 is written as \ufffd, read as U+FFFD, then written
		// as that character; from there on it is the same record.
		rec2, err := encodeRecord(e2, body2)
		if err != nil {
			t.Fatal(err)
		}
		e3, body3, err := decodeRecord(seqKey(1), rec2)
		if err != nil {
			t.Fatal(err)
		}
		if rec3, err := encodeRecord(e3, body3); err != nil || !bytes.Equal(rec3, rec2) {
			t.Fatalf("%q written back as %q, then as %q (%v)", data, rec2, rec3, err)
		}
	})
}
