package threadfeed

import (
	"errors"
	"fmt"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

// item is what a feed needs of one subscribeThread item: its kind, its
// sequence (an event's sequence, a snapshot's snapshotSequence), and for an
// event its type and raw payload. The payload is decoded only for the event
// types a projection holds (upsertLocked); a snapshot's projection is trimmed
// before it is decoded (decodeSnapshotProjection).
type item struct {
	kind    string
	seq     int64
	typ     string
	payload jx.Raw
}

var errNoKind = errors.New("thread stream item without a kind")

// decodeItem reads an item's kind, sequence and event envelope. Unknown keys
// are skipped; an item T3 sends that is not an object, or whose fields have
// the wrong types, is an error.
func decodeItem(raw []byte) (item, error) {
	var it item
	d := jx.DecodeBytes(raw)
	err := d.ObjBytes(func(d *jx.Decoder, key []byte) error {
		var err error
		switch string(key) {
		case "kind":
			it.kind, err = d.Str()
		case "sequence", "snapshotSequence":
			it.seq, err = d.Int64()
		case "event":
			err = d.ObjBytes(func(d *jx.Decoder, key []byte) error {
				switch string(key) {
				case "type":
					var err error
					it.typ, err = d.Str()
					return err
				case "payload":
					raw, err := d.Raw()
					it.payload = append(jx.Raw(nil), raw...)
					return err
				}
				return d.Skip()
			})
		default:
			err = d.Skip()
		}
		return err
	})
	if err != nil {
		return item{}, fmt.Errorf("decode thread stream item: %w", err)
	}
	if it.kind == "" {
		return item{}, errNoKind
	}
	if it.kind == "event" && (it.typ == "" || len(it.payload) == 0) {
		return item{}, fmt.Errorf("decode thread stream item: event %d without a type or payload", it.seq)
	}
	return it, nil
}

// decodeSnapshotProjection decodes the projection of a (trimmed) snapshot
// item.
func decodeSnapshotProjection(item []byte) (*t3api.ThreadProjection, error) {
	var p *t3api.ThreadProjection
	err := jx.DecodeBytes(item).ObjBytes(func(d *jx.Decoder, key []byte) error {
		if string(key) != "projection" {
			return d.Skip()
		}
		p = new(t3api.ThreadProjection)
		return p.Decode(d)
	})
	if err != nil {
		return nil, fmt.Errorf("decode thread snapshot: %w", err)
	}
	if p == nil {
		return nil, errors.New("decode thread snapshot: no projection")
	}
	return p, nil
}
