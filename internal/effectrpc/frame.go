package effectrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// inbound is one server message from a frame. A message that does not decode
// still reports what could be read of it, so a reply meant for a request can
// fail that request instead of leaving it waiting forever.
type inbound struct {
	msg t3rpc.ServerMessage
	// chunk is set for a Chunk read by decodeChunk; msg is then unset. Its values are slices of
	// the frame's bytes, not copies (see decodeChunk).
	chunk *borrowedChunk
	// err is set when the message did not decode; tag and requestID are then
	// best-effort reads of the raw object.
	err       error
	tag       string
	requestID string
}

// frameDecoder decodes one connection's frames (its read loop's, one goroutine), reusing its
// decoders and the slices of messages and Chunks from frame to frame: a new decoder per message
// and a new slice per frame were most of the bytes the read loop allocated per frame
// (BenchmarkDecodeChunkFrame, docs/benchmarks.md).
type frameDecoder struct {
	outer, inner jx.Decoder
	msgs         []inbound
	chunks       []borrowedChunk
}

// decode splits one WebSocket text frame into server messages. Effect's JSON serialization
// decodes `Array.isArray(x) ? x : [x]`, so a frame is either one message object or an array of
// them. Elements are decoded one by one so a single bad element does not lose its neighbours; on a
// malformed array the messages read before the fault are returned with the error. What it returns
// is valid until the next decode or done.
func (fd *frameDecoder) decode(data []byte) ([]inbound, error) {
	fd.done()
	d := &fd.outer
	d.ResetBytes(data)
	switch d.Next() {
	case jx.Object:
		fd.msgs = append(fd.msgs, fd.message(data))
		return fd.msgs, nil
	case jx.Array:
		err := d.Arr(func(d *jx.Decoder) error {
			raw, err := d.Raw()
			if err != nil {
				return err
			}
			fd.msgs = append(fd.msgs, fd.message(raw))
			return nil
		})
		if err != nil {
			return fd.msgs, fmt.Errorf("effectrpc: malformed frame: %w", err)
		}
		return fd.msgs, nil
	default:
		return nil, errors.New("effectrpc: frame is neither a message object nor an array of messages")
	}
}

// done drops what the last decode returned, so that nothing of it stays reachable from the
// reused slices and decoders (the frame's buffer: an idle connection would otherwise keep its
// last frame, a start-up snapshot of a megabyte, from the collector).
func (fd *frameDecoder) done() {
	fd.outer.ResetBytes(nil)
	fd.inner.ResetBytes(nil)
	clear(fd.msgs)
	fd.msgs = fd.msgs[:0]
	clear(fd.chunks)
	fd.chunks = fd.chunks[:0]
}

func (fd *frameDecoder) message(raw []byte) inbound {
	fd.chunks = append(fd.chunks, borrowedChunk{})
	ch := &fd.chunks[len(fd.chunks)-1]
	if decodeChunk(&fd.inner, raw, ch) {
		return inbound{chunk: ch}
	}
	*ch = borrowedChunk{}
	fd.chunks = fd.chunks[:len(fd.chunks)-1]
	var m t3rpc.ServerMessage
	d := &fd.inner
	d.ResetBytes(raw)
	if err := m.Decode(d); err != nil {
		in := inbound{err: err}
		in.tag, in.requestID = peekMessage(raw)
		return in
	}
	return inbound{msg: m}
}

// borrowedChunk is a Chunk message whose values are slices of the frame it came in: valid while
// the frame's buffer is (Conn.readLoop lends it to the stream handler, see frame).
type borrowedChunk struct {
	id     string // the request's map key (idKey)
	values []jx.Raw
}

// errNotFast ends decodeChunk's scan of a message it leaves to the generated decoder.
var errNotFast = errors.New("not a plain Chunk")

// decodeChunk reads a Chunk message without copying its values: each is the slice of raw that
// holds it. The generated decoder copies every value (jx's RawAppend), and a stream handler
// decodes each value once more anyway: under load the copies were most of the read loop's CPU
// and a large share of the connector's allocation (docs/benchmarks.md, issue 12, "ingest").
//
// It takes only what the generated decoder would decode to the same Chunk: exactly the keys
// _tag ("Chunk"), requestId (a string or an int64) and values (an array), each once. Anything
// else (another message, a duplicate or unknown key, a malformed value) reports false and is
// left to the generated decoder, which decodes it or says what is wrong with it.
//
// It decodes into ch with d (both reused by the caller) and reports whether it took the message.
func decodeChunk(d *jx.Decoder, raw []byte, ch *borrowedChunk) bool {
	d.ResetBytes(raw)
	if d.Next() != jx.Object {
		return false
	}
	var seen uint8
	const tagSeen, idSeen, valuesSeen = 1, 2, 4
	once := func(bit uint8) error {
		if seen&bit != 0 {
			return errNotFast
		}
		seen |= bit
		return nil
	}
	err := d.ObjBytes(func(d *jx.Decoder, k []byte) error {
		switch string(k) {
		case "_tag":
			if err := once(tagSeen); err != nil {
				return err
			}
			if d.Next() != jx.String {
				return errNotFast
			}
			tag, err := d.StrBytes()
			if err != nil || string(tag) != "Chunk" {
				return errNotFast
			}
		case "requestId":
			if err := once(idSeen); err != nil {
				return err
			}
			switch d.Next() {
			case jx.String:
				id, err := d.Str()
				if err != nil {
					return errNotFast
				}
				ch.id = id
			case jx.Number:
				n, err := d.Int64()
				if err != nil {
					return errNotFast
				}
				ch.id = strconv.FormatInt(n, 10)
			default:
				return errNotFast
			}
		case "values":
			if err := once(valuesSeen); err != nil {
				return err
			}
			if d.Next() != jx.Array {
				return errNotFast
			}
			ch.values = make([]jx.Raw, 0, 8)
			return d.Arr(func(d *jx.Decoder) error {
				v, err := d.Raw()
				if err != nil {
					return errNotFast
				}
				ch.values = append(ch.values, v)
				return nil
			})
		default:
			return errNotFast
		}
		return nil
	})
	if err != nil || seen != tagSeen|idSeen|valuesSeen {
		return false
	}
	// Nothing may follow the message (the generated decoder of a frame's element is given the
	// element alone, so this only guards a caller that passes more).
	return d.Next() == jx.Invalid
}

// copyValues copies values into one allocation: what a stream handler that may keep them gets
// (Conn.Stream), instead of a slice of the frame that the next frame overwrites.
func copyValues(values []jx.Raw) []jx.Raw {
	n := 0
	for _, v := range values {
		n += len(v)
	}
	arena := make([]byte, 0, n)
	out := make([]jx.Raw, len(values))
	for i, v := range values {
		start := len(arena)
		arena = append(arena, v...)
		out[i] = jx.Raw(arena[start:len(arena):len(arena)])
	}
	return out
}

// peekMessage reads _tag and requestId from a message object without
// validating anything else.
func peekMessage(raw []byte) (tag, requestID string) {
	d := jx.DecodeBytes(raw)
	if d.Next() != jx.Object {
		return "", ""
	}
	_ = d.ObjBytes(func(d *jx.Decoder, k []byte) error {
		switch string(k) {
		case "_tag":
			if d.Next() == jx.String {
				v, err := d.Str()
				tag = v
				return err
			}
		case "requestId":
			switch d.Next() {
			case jx.String:
				v, err := d.Str()
				requestID = v
				return err
			case jx.Number:
				n, err := d.Num()
				if err != nil {
					return err
				}
				if i, err := n.Int64(); err == nil {
					requestID = strconv.FormatInt(i, 10)
				} else {
					requestID = n.String()
				}
				return nil
			}
		}
		return d.Skip()
	})
	return tag, requestID
}

// idKey is the map key of a request id. This client sends ids as decimal
// strings ("0", "1", … as T3's web client does); T3 echoes the id verbatim, but
// a number is accepted too, so both spellings map to the same key.
func idKey(id t3rpc.RequestId) string {
	if id.IsInt64() {
		return strconv.FormatInt(id.Int64, 10)
	}
	return id.String
}

// encodePayload turns a request payload into raw JSON. Generated types
// implement json.Marshaler on their pointer, so a value is boxed to reach it
// (encoding/json would otherwise fall back to reflection and write ogen's Opt
// wrappers as objects).
func encodePayload(p any) (jx.Raw, error) {
	switch v := p.(type) {
	case nil:
		return jx.Raw("{}"), nil
	case json.RawMessage:
		return checkRaw(v)
	case jx.Raw:
		return checkRaw(v)
	case json.Marshaler:
		b, err := v.MarshalJSON()
		return jx.Raw(b), err
	}
	rv := reflect.ValueOf(p)
	if rv.Kind() != reflect.Pointer {
		ptr := reflect.New(rv.Type())
		ptr.Elem().Set(rv)
		if m, ok := ptr.Interface().(json.Marshaler); ok {
			b, err := m.MarshalJSON()
			return jx.Raw(b), err
		}
	}
	b, err := json.Marshal(p)
	return jx.Raw(b), err
}

// checkRaw refuses invalid JSON: it would corrupt the whole frame and T3 would
// answer with a Defect that kills the socket for every other request.
func checkRaw(b []byte) (jx.Raw, error) {
	if len(b) == 0 {
		return jx.Raw("{}"), nil
	}
	if !json.Valid(b) {
		return nil, errors.New("payload is not valid JSON")
	}
	return jx.Raw(b), nil
}

// decodeResult stores a success value into result.
func decodeResult(raw jx.Raw, result any) error {
	switch r := result.(type) {
	case nil:
		return nil
	case *json.RawMessage:
		*r = append((*r)[:0], raw...)
		return nil
	case *jx.Raw:
		*r = append((*r)[:0], raw...)
		return nil
	case json.Unmarshaler:
		return r.UnmarshalJSON(raw)
	default:
		return json.Unmarshal(raw, result)
	}
}

// isNull reports whether a success value is absent or JSON null.
func isNull(raw jx.Raw) bool {
	if len(raw) == 0 {
		return true
	}
	return jx.DecodeBytes(raw).Next() == jx.Null
}

func encodeClient(m t3rpc.ClientMessage) []byte {
	var e jx.Encoder
	m.Encode(&e)
	return e.Bytes()
}
