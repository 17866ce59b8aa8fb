package effectrpc

import (
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/go-faster/jx"
)

// BenchmarkStreamChunks is a stream whose server sends each Chunk as soon as the Ack of the one
// before arrives (T3's flow control), to a handler that spends handlerWork on each, as a
// thread feed applies an event: ns/op is per Chunk. "after" acknowledges once the handler
// returned (Stream): a Chunk's round trip and the handler's work add up. "ahead" acknowledges
// as the read loop queues it (StreamAhead): the next Chunk travels while the handler works.
// "inline" runs the handler on the read loop and acknowledges there (StreamInline, the shell
// stream's chunks that need no commit): the Chunk's work and round trip add up as in "after",
// without the hand-off to the stream's goroutine. The "-idle" modes have a handler that does
// nothing (a run's step costs the watcher a few µs): ns/op and cpu-ns/op (the process's CPU,
// server included) are then the Chunk's round trip and hand-offs alone.
func BenchmarkStreamChunks(b *testing.B) {
	for _, mode := range []string{"after", "ahead", "inline", "after-idle", "inline-idle"} {
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
			if strings.HasSuffix(mode, "-idle") {
				handler = func(values []jx.Raw) error {
					sink += len(values)
					return nil
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			switch strings.TrimSuffix(mode, "-idle") {
			case "after":
				err = c.Stream(b.Context(), "test.stream", nil, handler)
			case "ahead":
				err = c.StreamAhead(b.Context(), "test.stream", nil, 2, handler)
			case "inline":
				err = c.StreamInline(b.Context(), "test.stream", nil, func(ch Chunk) func() error {
					_ = handler(ch.Values)
					return nil
				})
			}
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			if sink == 0 {
				b.Fatal("handler did nothing")
			}
		})
	}
}

// processCPU is the process's user and system CPU time so far, in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
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
