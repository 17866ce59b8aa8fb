package effectrpc

import (
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
			m.msg.Encode(&e)
			var again t3rpc.ServerMessage
			if err := again.Decode(jx.DecodeBytes(e.Bytes())); err != nil {
				t.Fatalf("re-encoded %s does not decode: %v", e.Bytes(), err)
			}
			if again.Type != m.msg.Type || requestOf(again) != requestOf(m.msg) {
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
