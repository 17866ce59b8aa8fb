package watch

import (
	"errors"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// decodeItem decodes one shell stream item into it, which must be zero (decodeItems' pooled
// items are). It decodes what t3rpc.ShellStreamItem.Decode decodes (FuzzDecodeItem checks that
// both give the same item or both an error) with two costs of the generated decoder taken out of
// every item of a busy stream:
//
//   - the generated decoder zeroes the item's thread row (most of a kilobyte, pointers
//     included: a write barrier per word while the collector runs) before decoding into it, and
//     it is zero already;
//   - the kind is one of a few known strings: it is taken from them instead of allocating one
//     per item;
//   - the thread row's strings are those of the rows decoded before it when equal (decodeShell,
//     recentStrings; rs may be nil);
//   - the decoder is rs's, reset for each item, not a new one per item.
//
// Every other field is decoded by the generated decoders of its type.
func decodeItem(it *t3rpc.ShellStreamItem, raw []byte, rs *recentStrings) error {
	hasKind := false
	err := rs.decoder(raw).ObjBytes(func(d *jx.Decoder, k []byte) error {
		switch string(k) {
		case "kind":
			v, err := d.StrBytes()
			if err != nil {
				return err
			}
			it.Kind = itemKind(v)
			hasKind = true
		case "thread":
			if it.Thread.Set {
				it.Thread.Reset() // a repeated key: the last one counts, as in the generated decoder
			}
			it.Thread.Set = true
			return decodeShell(d, &it.Thread.Value, rs)
		case "sequence":
			return decodeField(&it.Sequence, d)
		case "snapshot":
			return decodeField(&it.Snapshot, d)
		case "project":
			return decodeField(&it.Project, d)
		case "projectId":
			return decodeField(&it.ProjectId, d)
		case "location":
			return decodeField(&it.Location, d)
		case "threadId":
			return decodeField(&it.ThreadId, d)
		default:
			return d.Skip()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !hasKind {
		return errNoKind
	}
	return nil
}

// optField is a generated optional field.
type optField interface {
	Reset()
	Decode(d *jx.Decoder) error
}

// decodeField decodes an optional field as the generated decoder does: the last of repeated keys
// counts.
func decodeField(f optField, d *jx.Decoder) error {
	f.Reset()
	return f.Decode(d)
}

var errNoKind = errors.New(`shell item without "kind"`)

// itemKind is the kind as a string, one of the known ones without an allocation.
func itemKind(v []byte) string {
	switch string(v) {
	case "thread.updated":
		return "thread.updated"
	case "thread.removed":
		return "thread.removed"
	case "project.updated":
		return "project.updated"
	case "project.removed":
		return "project.removed"
	case "snapshot":
		return "snapshot"
	case "synchronized":
		return "synchronized"
	}
	return string(v)
}
