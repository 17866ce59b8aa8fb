package effectrpc

import (
	"strconv"
	"testing"

	"github.com/go-faster/jx"
)

// BenchmarkStreamChunks is a stream whose server sends each Chunk as soon as the Ack of the one
// before arrives (T3's flow control), to a handler that spends handlerWork on each, as a
// thread feed applies an event: ns/op is per Chunk. "after" acknowledges once the handler
// returned (Stream): a Chunk's round trip and the handler's work add up. "ahead" acknowledges
// as the read loop queues it (StreamAhead): the next Chunk travels while the handler works.
func BenchmarkStreamChunks(b *testing.B) {
	for _, mode := range []string{"after", "ahead"} {
		b.Run(mode, func(b *testing.B) {
			n := b.N
			ts := newServer(b, func(p *peer) {
				s, ok := p.request()
				if !ok {
					return
				}
				id := s.ID.String
				for i := 0; i < n; i++ {
					p.send(chunk(id, strconv.Itoa(i)))
					if r, ok := p.recv(); !ok || !r.msg.IsAck() {
						return
					}
				}
				p.send(exitOK(id, ""))
			})
			c, err := Dial(b.Context(), ts.wsURL(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			sink := 0
			handler := func(values []jx.Raw) error {
				sink += handlerWork(len(values[0]))
				return nil
			}
			b.ResetTimer()
			if mode == "after" {
				err = c.Stream(b.Context(), "test.stream", nil, handler)
			} else {
				err = c.StreamAhead(b.Context(), "test.stream", nil, 2, handler)
			}
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if sink == 0 {
				b.Fatal("handler did nothing")
			}
		})
	}
}

// handlerWork is a fixed amount of CPU per Chunk (tens of microseconds; a thread feed's apply of
// a settle chunk is 15-30 µs, BenchmarkFeedSettleChunk): "after" pays it plus a round trip per
// Chunk, "ahead" about the larger of the two.
func handlerWork(seed int) int {
	x := seed + 1
	for i := 0; i < 40_000; i++ {
		x = x*1103515245 + 12345
	}
	return x | 1
}
