package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"
	"unicode/utf8"

	"github.com/go-faster/jx"
)

// A tracked thread's record is the JSON encoding/json makes of Thread (putThread), and the
// detector reads the records of every chunk's threads that may carry an event (GetThreads, on
// the path that holds the chunk's Ack): encoding/json's reflection there was 70 % of that read
// (json.Unmarshal 0.30 of GetThreads' 0.45 s in a 15 s latency phase, 0.4 of 0.6 s in a
// throughput phase). decodeThread reads the records putThread writes with jx instead, and hands
// everything else to json.Unmarshal, so that it reads every record exactly as json.Unmarshal
// does (FuzzDecodeThread compares the two): a string with an escape or outside plain UTF-8 (an
// HTML character in a title, which encoding/json writes as \u0026), a key that is not one of
// Thread's exactly (encoding/json also takes them in another case), a value of another type,
// anything after the object.

// errNotPlain: the record is not one decodeThread reads itself (json.Unmarshal does).
var errNotPlain = errors.New("store: not a plain thread record")

// decodeThread reads a tracked thread's record into t, as json.Unmarshal(v, t) does into a zero
// Thread.
func decodeThread(v []byte, t *Thread) error {
	*t = Thread{}
	if decodePlainThread(v, t) == nil {
		return nil
	}
	*t = Thread{}
	return json.Unmarshal(v, t)
}

// decodePlainThread reads a record as putThread writes it, failing (with t partly set) on
// anything else.
func decodePlainThread(v []byte, t *Thread) error {
	d := jx.DecodeBytes(v)
	err := d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		if d.Next() == jx.Null {
			// encoding/json leaves a field as it is on null (a Thread field is never a pointer).
			if !knownThreadKey(key) {
				return errNotPlain
			}
			return d.Null()
		}
		var err error
		switch string(key) {
		case "id":
			t.ID, err = plainStr(d)
		case "machine":
			t.Machine, err = plainStr(d)
		case "projectId":
			t.ProjectID, err = plainStr(d)
		case "projectTitle":
			t.ProjectTitle, err = plainStr(d)
		case "title":
			t.Title, err = plainStr(d)
		case "origin":
			t.Origin, err = plainStr(d)
		case "watch":
			if d.Next() != jx.Bool {
				return errNotPlain
			}
			t.Watch, err = d.Bool()
		case "lastMessageId":
			t.LastMessageID, err = plainStr(d)
		case "lastRunId":
			t.LastRunID, err = plainStr(d)
		case "createdAt":
			err = plainTime(d, &t.CreatedAt)
		case "updatedAt":
			err = plainTime(d, &t.UpdatedAt)
		default:
			return errNotPlain
		}
		return err
	})
	if err != nil {
		return err
	}
	if d.Skip() != io.EOF { // something after the object
		return errNotPlain
	}
	return nil
}

// knownThreadKey reports whether key is one of Thread's JSON keys as putThread writes them.
func knownThreadKey(key []byte) bool {
	switch string(key) {
	case "id", "machine", "projectId", "projectTitle", "title", "origin", "watch", "lastMessageId",
		"lastRunId", "createdAt", "updatedAt":
		return true
	}
	return false
}

// plainStr reads a string without escapes whose bytes are UTF-8 and no control character: its
// value is then its bytes, for jx as for encoding/json.
func plainStr(d *jx.Decoder) (string, error) {
	b, err := plainStrBytes(d)
	return string(b), err
}

func plainStrBytes(d *jx.Decoder) ([]byte, error) {
	if d.Next() != jx.String {
		return nil, errNotPlain
	}
	raw, err := d.Raw()
	if err != nil {
		return nil, err
	}
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, errNotPlain
	}
	b := raw[1 : len(raw)-1]
	if bytes.IndexByte(b, '\\') >= 0 || !utf8.Valid(b) {
		return nil, errNotPlain
	}
	for _, c := range b {
		if c < 0x20 {
			return nil, errNotPlain
		}
	}
	return b, nil
}

// plainTime reads a time as time.Time's UnmarshalJSON does, from a plain string.
func plainTime(d *jx.Decoder, t *time.Time) error {
	b, err := plainStrBytes(d)
	if err != nil {
		return err
	}
	var at time.Time
	if err := at.UnmarshalText(b); err != nil {
		return errNotPlain // json.Unmarshal says what is wrong with it
	}
	*t = at
	return nil
}
