package effectrpc

import (
	"fmt"
	"strings"
	"testing"
)

// chunkFrame is a Chunk frame of n shell items as T3 sends them to subscribeShell: each a
// thread.updated item with a full row (the shape of the fixtures' subscribeShell chunks).
func chunkFrame(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"_tag":"Chunk","requestId":"3","values":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"kind":"thread.updated","sequence":%d,"thread":{"id":"thread-%03d","projectId":"project-1",`+
			`"title":"Load thread %d: fix the flaky payment test","modelSelection":{"instanceId":"codex","model":"gpt-5.5"},`+
			`"runtimeMode":"full-access","interactionMode":"default","branch":null,"worktreePath":null,"status":"running",`+
			`"latestRunId":"run-%d","activeRunId":"run-%d","latestRunRequestedAt":"2026-12-01T10:00:00.000Z",`+
			`"latestRunStartedAt":"2026-12-01T10:00:00.120Z","latestRunCompletedAt":null,"activityRunStatus":"running",`+
			`"lastError":null,"pendingRuntimeRequest":null,"latestVisibleMessage":{"id":"msg-%d","role":"assistant",`+
			`"text":"Working on it: reading the failing test and the payment client.","createdAt":"2026-12-01T10:00:01.000Z"},`+
			`"itemCount":%d,"createdAt":"2026-11-30T09:00:00.000Z","updatedAt":"2026-12-01T10:00:01.000Z",`+
			`"archivedAt":null,"deletedAt":null}}`, i+1, i%128, i%128, i, i, i, 10+i)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkDecodeChunkFrame is the read loop's decode of one Chunk frame of shell items, up to the
// values the stream handler gets: 4 items (a machine the connector keeps up with) and 256 (one
// it lags behind). ns/op and allocs/op are per frame, decoded by one frameDecoder as the read loop's.
func BenchmarkDecodeChunkFrame(b *testing.B) {
	for _, n := range []int{4, 256} {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			frame := chunkFrame(n)
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			var fd frameDecoder // one per connection, as in the read loop
			for b.Loop() {
				msgs, err := fd.decode(frame)
				if err != nil || len(msgs) != 1 || msgs[0].err != nil {
					b.Fatal(err)
				}
				fd.done()
			}
		})
	}
}
