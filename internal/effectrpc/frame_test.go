package effectrpc

import (
	"bytes"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

func TestDecodeFrameShapes(t *testing.T) {
	cases := []struct {
		frame   string
		n       int
		wantErr bool
	}{
		{`{"_tag":"Pong"}`, 1, false},
		{` [{"_tag":"Pong"},{"_tag":"Exit","requestId":3,"exit":{"_tag":"Success"}}] `, 2, false},
		{`[]`, 0, false},
		{`"Pong"`, 0, true},
		{`[{"_tag":"Pong"},`, 1, true},
	}
	for _, tc := range cases {
		msgs, err := decodeFrame([]byte(tc.frame))
		if (err != nil) != tc.wantErr || len(msgs) != tc.n {
			t.Errorf("%s: %d messages, err %v", tc.frame, len(msgs), err)
		}
	}
	// A message that does not decode still names its request.
	msgs, _ := decodeFrame([]byte(`[{"_tag":"Exit","requestId":12,"exit":{"_tag":"Sideways"}},{"_tag":"Brand-new"}]`))
	if len(msgs) != 2 || msgs[0].err == nil || msgs[0].requestID != "12" || msgs[0].tag != "Exit" || msgs[1].tag != "Brand-new" {
		t.Fatalf("%+v", msgs)
	}
}

// FuzzDecodeFrame: no input panics the decoder, and what decodes re-encodes to
// a message that decodes to the same kind and request.
func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range allRecvFrames(f) {
		f.Add([]byte(fr))
	}
	f.Add([]byte(`[{"_tag":"Chunk","requestId":1,"values":[{"kind":"synchronized"}]},{"_tag":"Pong"}]`))
	f.Add([]byte(`{"_tag":"Defect","defect":"Invalid request id"}`))
	f.Add([]byte(`{"_tag":"ClientProtocolError","error":{"message":"x"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs, _ := decodeFrame(data)
		for _, m := range msgs {
			if m.err != nil {
				continue
			}
			var e jx.Encoder
			asMessage(m).Encode(&e)
			var again t3rpc.ServerMessage
			if err := again.Decode(jx.DecodeBytes(e.Bytes())); err != nil {
				t.Fatalf("re-encoded %s does not decode: %v", e.Bytes(), err)
			}
			if msg := asMessage(m); again.Type != msg.Type || requestOf(again) != requestOf(msg) {
				t.Fatalf("round trip changed %s", e.Bytes())
			}
		}
	})
}

func requestOf(m t3rpc.ServerMessage) string {
	switch m.Type {
	case t3rpc.ChunkServerMessage:
		return idKey(m.Chunk.RequestId)
	case t3rpc.ExitServerMessage:
		return idKey(m.Exit.RequestId)
	}
	return ""
}

// asMessage is m as the generated type (a borrowed Chunk made into one).
func asMessage(m inbound) t3rpc.ServerMessage {
	if m.chunk == nil {
		return m.msg
	}
	return t3rpc.NewChunkServerMessage(t3rpc.Chunk{Tag: "Chunk", RequestId: t3rpc.NewStringRequestId(m.chunk.id), Values: m.chunk.values})
}

func TestDecodeChunkBorrowsOnlyPlainChunks(t *testing.T) {
	plain := []string{
		`{"_tag":"Chunk","requestId":"7","values":[{"kind":"synchronized"}, [1,2] ,"x"]}`,
		`{"values":[],"requestId":7,"_tag":"Chunk"}`,
		` {"_tag":"Chunk","requestId":"7","values":[ {"a" : 1} ]} `,
	}
	for _, raw := range plain {
		ch, ok := chunkAlone([]byte(raw))
		if !ok || ch.id != "7" {
			t.Fatalf("%s: not read as a plain Chunk (%v, %+v)", raw, ok, ch)
		}
		checkSameAsGenerated(t, []byte(raw), ch)
	}
	// Values are slices of the frame: nothing copied.
	raw := []byte(plain[0])
	ch, _ := chunkAlone(raw)
	if len(ch.values) != 3 || &ch.values[0][0] != &raw[bytes.Index(raw, []byte(`{"kind"`))] {
		t.Fatalf("values %q are not slices of the frame", ch.values)
	}
	// Left to the generated decoder, which decodes or refuses them as before.
	others := []string{
		`{"_tag":"Exit","requestId":"7","exit":{"_tag":"Success","value":null}}`,
		`{"_tag":"Chunk","requestId":"7","values":[1],"extra":true}`,
		`{"_tag":"Chunk","requestId":"7","requestId":"8","values":[1]}`,
		`{"_tag":"Chunk","requestId":1.5,"values":[1]}`,
		`{"_tag":"Chunk","requestId":"7"}`,
		`{"_tag":"Chunk","requestId":"7","values":{}}`,
		`{"_tag":"Chunk","requestId":"7","values":[1,]}`,
		`{"_tag":"Chunk","requestId":"7","values":[1]`,
		`[{"_tag":"Chunk","requestId":"7","values":[1]}]`,
	}
	for _, raw := range others {
		if _, ok := chunkAlone([]byte(raw)); ok {
			t.Errorf("%s: read as a plain Chunk", raw)
		}
	}
	// Through decodeFrame: the extra key is read by the generated decoder, as before.
	msgs, err := decodeFrame([]byte(`[` + others[1] + `,` + plain[1] + `]`))
	if err != nil || len(msgs) != 2 || msgs[0].chunk != nil || msgs[0].msg.Type != t3rpc.ChunkServerMessage || msgs[1].chunk == nil {
		t.Fatalf("%+v, %v", msgs, err)
	}
}

// checkSameAsGenerated fails unless the generated decoder reads raw as the same Chunk.
func checkSameAsGenerated(t *testing.T, raw []byte, ch *borrowedChunk) {
	t.Helper()
	var m t3rpc.ServerMessage
	if err := m.Decode(jx.DecodeBytes(raw)); err != nil {
		t.Fatalf("%s: read as a plain Chunk, but the generated decoder refuses it: %v", raw, err)
	}
	if m.Type != t3rpc.ChunkServerMessage || idKey(m.Chunk.RequestId) != ch.id || len(m.Chunk.Values) != len(ch.values) {
		t.Fatalf("%s: generated %+v, borrowed %+v", raw, m, ch)
	}
	for i, v := range m.Chunk.Values {
		if !bytes.Equal(v, ch.values[i]) {
			t.Fatalf("%s: value %d: generated %s, borrowed %s", raw, i, v, ch.values[i])
		}
	}
}

// FuzzDecodeChunk: whatever decodeChunk reads, the generated decoder reads the same (it is only
// a faster path to the same Chunk), and copyValues keeps the values byte for byte.
func FuzzDecodeChunk(f *testing.F) {
	for _, fr := range allRecvFrames(f) {
		f.Add([]byte(fr))
	}
	f.Add(chunkFrame(3))
	f.Add([]byte(`{"values":[],"requestId":7,"_tag":"Chunk"}`))
	f.Add([]byte(`{"_tag":"Chunk","requestId":"7","requestId":"8","values":[1]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ch, ok := chunkAlone(raw)
		if !ok {
			return
		}
		checkSameAsGenerated(t, raw, ch)
		cp := copyValues(ch.values)
		for i := range cp {
			if !bytes.Equal(cp[i], ch.values[i]) {
				t.Fatalf("copy of value %d: %s, not %s", i, cp[i], ch.values[i])
			}
		}
	})
}

// decodeFrame decodes one frame with a frameDecoder of its own.
func decodeFrame(data []byte) ([]inbound, error) {
	var fd frameDecoder
	return fd.decode(data)
}

// chunkAlone is decodeChunk with a decoder and a Chunk of its own.
func chunkAlone(raw []byte) (*borrowedChunk, bool) {
	var (
		d  jx.Decoder
		ch borrowedChunk
	)
	ok := decodeChunk(&d, raw, &ch)
	return &ch, ok
}

// TestFrameDecoderReused: the read loop decodes every frame of a connection with one
// frameDecoder; a frame's messages are its own whatever came before (plain Chunks, Chunks left to
// the generated decoder, other messages, a malformed frame), and done leaves nothing of a frame
// reachable from the reused slices and decoders.
func TestFrameDecoderReused(t *testing.T) {
	var fd frameDecoder
	frames := []struct {
		frame string
		want  []string // per message: "chunk <id> <values>", "msg <type>" or "err"
	}{
		{`[{"_tag":"Chunk","requestId":"1","values":[1,2]},{"_tag":"Exit","requestId":"2","exit":{"_tag":"Success","value":null}},{"_tag":"Chunk","requestId":"3","values":[3]}]`,
			[]string{"chunk 1 2", "msg Exit", "chunk 3 1"}},
		{`{"_tag":"Chunk","requestId":"4","values":[4,5,6]}`, []string{"chunk 4 3"}},
		{`[{"_tag":"Chunk","requestId":"5","values":[1],"extra":true},{"_tag":"Chunk","requestId":"6","values":[]}]`,
			[]string{"msg Chunk", "chunk 6 0"}},
		{`{"_tag":"Pong"}`, []string{"msg Pong"}},
		{`[{"_tag":"Brand-new"},{"_tag":"Chunk","requestId":"7","values":[7]}]`, []string{"err", "chunk 7 1"}},
		{`[{"_tag":"Chunk","requestId":"8","values":[8]},`, []string{"chunk 8 1"}},
		{`{"_tag":"Chunk","requestId":"9","values":[9]}`, []string{"chunk 9 1"}},
	}
	for _, f := range frames {
		msgs, _ := fd.decode([]byte(f.frame))
		var got []string
		for _, m := range msgs {
			switch {
			case m.chunk != nil:
				got = append(got, "chunk "+m.chunk.id+" "+strconv.Itoa(len(m.chunk.values)))
			case m.err != nil:
				got = append(got, "err")
			default:
				got = append(got, "msg "+string(m.msg.Type))
			}
		}
		if !slices.Equal(got, f.want) {
			t.Fatalf("%s: decoded %q, want %q", f.frame, got, f.want)
		}
		fd.done()
		for i, m := range fd.msgs[:cap(fd.msgs)] {
			if m.chunk != nil || m.err != nil || m.msg.Type != "" {
				t.Fatalf("after %s: message slot %d still holds %+v", f.frame, i, m)
			}
		}
		for _, d := range []*jx.Decoder{&fd.outer, &fd.inner} {
			if n := reflect.ValueOf(d).Elem().FieldByName("buf").Len(); n != 0 {
				t.Fatalf("after %s: a decoder still holds %d bytes of the frame", f.frame, n)
			}
		}
		for i, ch := range fd.chunks[:cap(fd.chunks)] {
			if ch.id != "" || ch.values != nil {
				t.Fatalf("after %s: Chunk slot %d still holds %+v", f.frame, i, ch)
			}
		}
	}
}
