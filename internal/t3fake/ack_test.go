package t3fake

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// encodedAck is an Ack as the connector writes it (effectrpc encodes it with t3rpc).
func encodedAck(id string) []byte {
	var e jx.Encoder
	m := t3rpc.NewAckClientMessage(t3rpc.Ack{RequestId: t3rpc.NewStringRequestId(id)})
	m.Encode(&e)
	return e.Bytes()
}

// The connector's Acks take the short path, whatever their request id: plainAckID reads the id
// of each as the message decoder does.
func TestPlainAckIDReadsTheConnectorsAcks(t *testing.T) {
	for _, id := range []string{"0", "1", "12", "4294967296", "9223372036854775807", "req-é"} {
		raw := encodedAck(id)
		got, ok := plainAckID(raw)
		if !ok || string(got) != id {
			t.Errorf("%s: plainAckID = %q, %v; want %q, true", raw, got, ok, id)
		}
	}
	for _, raw := range []string{
		`{"_tag":"Ack","requestId":"a\"b"}`,
		`{"_tag":"Ack","requestId":"a\\b"}`,
		`{"_tag":"Ack","requestId":"a` + "\n" + `"}`,
		`{"_tag":"Ack","requestId":"` + "\xff" + `"}`,
		`{"_tag":"Ack","requestId":7}`,
		`{"_tag":"Ack","requestId":"7"} `,
		`{"_tag":"Ack", "requestId":"7"}`,
		`{"requestId":"7","_tag":"Ack"}`,
		`{"_tag":"Ack","requestId":"7","x":1}`,
		`{"_tag":"Ack","requestId":"7"`,
		`{"_tag":"Ping"}`,
	} {
		if id, ok := plainAckID([]byte(raw)); ok {
			t.Errorf("%s: plainAckID = %q, true; want the decoder's path", raw, id)
		}
	}
}

// An Ack in another form than the connector's (other key order, spacing, a number id) still
// settles its stream through the message decoder: each lets the next Chunk go.
func TestAckInOtherFormsSettlesTheStream(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	shell := c.subscribe("orchestration.subscribeShell", `{}`, false)
	for len(c.chunks[shell]) == 0 {
		c.pump()
	}
	forms := []string{
		`{"requestId":%q,"_tag":"Ack"}`,
		`{ "_tag" : "Ack" , "requestId" : %q }`,
		`[{"_tag":"Ack","requestId":%q}]`,
	}
	for i, form := range forms {
		s.AddThread(pid, fmt.Sprintf("t%d", i), "idle") // a row queued behind the Chunk out
		c.barrier()
		n := len(c.chunks[shell])
		c.sendRaw(fmt.Sprintf(form, shell))
		for len(c.chunks[shell]) == n {
			c.pump()
		}
	}
	if st := s.Stats(); st.AcksReceived != int64(len(forms)) {
		t.Errorf("AcksReceived %d, want %d", st.AcksReceived, len(forms))
	}
}

// Whatever plainAckID accepts, the message decoder reads as an Ack of a string request id with
// the same bytes, so the short path answers as the decoder would.
func FuzzPlainAckID(f *testing.F) {
	for _, seed := range []string{`{"_tag":"Ack","requestId":"12"}`, `{"_tag":"Ack","requestId":"a\"b"}`,
		`{"_tag":"Ack","requestId":""}`, `{"_tag":"Ack","requestId":"` + "\xc3\xa9" + `"}`, `{"_tag":"Ping"}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		id, ok := plainAckID(raw)
		if !ok {
			return
		}
		var m t3rpc.ClientMessage
		if err := m.Decode(jx.DecodeBytes(raw)); err != nil {
			t.Fatalf("%q: plainAckID took it (%q), the decoder fails: %v", raw, id, err)
		}
		if m.Type != t3rpc.AckClientMessage {
			t.Fatalf("%q: the decoder reads a %v", raw, m.Type)
		}
		if key := requestKey(m.Ack.RequestId); key != "s"+string(id) {
			t.Fatalf("%q: the decoder's request key %q, plainAckID's id %q", raw, key, id)
		}
		if !bytes.Equal(raw, encodedAck(string(id))) {
			t.Fatalf("%q: not what t3rpc encodes for id %q", raw, id)
		}
	})
}

// BenchmarkHandleAck is the reader's handling of one connector Ack (the frame already read):
// decode, find the stream, settle its Chunk.
func BenchmarkHandleAck(b *testing.B) {
	s, err := New(Options{ManualSteps: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	c := &conn{s: s, subs: map[string]*sub{}, wake: make(chan struct{}, 1)}
	for i := range 1000 { // the connector's thread streams beside its shell stream
		id := t3rpc.NewStringRequestId(fmt.Sprint(i + 2))
		sb := &sub{c: c, id: id, key: requestKey(id)}
		c.subs[sb.key] = sb
	}
	sb := c.subs[requestKey(t3rpc.NewStringRequestId("7"))]
	raw := encodedAck("7")
	b.ReportAllocs()
	for b.Loop() {
		sb.inflight = true
		c.handleMessage(raw)
	}
	if sb.inflight {
		b.Fatal("the Ack did not settle the stream")
	}
}
