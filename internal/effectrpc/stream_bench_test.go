package effectrpc

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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

// BenchmarkAcksOfChunksReadTogether: a server with one Chunk of each of 4 inline streams ready at
// once writes them in one TCP write and waits for all 4 Acks before the next round, as T3 does
// per stream. "together" is the read loop as it is (peekConn: the Acks go out in one frame);
// "apart" reads the socket without it (one frame, one write, per Ack). ns/op and cpu-ns/op (the
// process's CPU, server included) are per Chunk.
func BenchmarkAcksOfChunksReadTogether(b *testing.B) {
	const streams = 4
	for _, mode := range []string{"together", "apart"} {
		b.Run(mode, func(b *testing.B) {
			noPeek = mode == "apart"
			defer func() { noPeek = false }()
			rs := newRawServer(b)
			c, err := Dial(b.Context(), "ws"+strings.TrimPrefix(rs.URL, "http")+"/ws", Options{PingInterval: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			p := <-rs.conns
			errs := make(chan error, streams)
			var ids []string
			for range streams {
				go func() {
					errs <- c.StreamInline(b.Context(), "test.stream", nil, func(Chunk) func() error { return nil })
				}()
				f := p.next()
				if len(f) != 1 || !f[0].IsRequest() {
					b.Fatalf("want a Request, got %v", f)
				}
				ids = append(ids, f[0].Request.ID.String)
			}
			frames := make([][]byte, streams)
			for i, id := range ids {
				frames[i] = serverFrame(chunk(id, `{"kind":"thread.updated","sequence":1}`))
			}
			rounds := (b.N + streams - 1) / streams
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for range rounds {
				p.write(frames...)
				for n := 0; n < streams; {
					n += len(p.next())
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(rounds*streams), "cpu-ns/op")
			endStreams(b, p, ids, errs)
		})
	}
}
