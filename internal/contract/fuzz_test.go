package contract

import (
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// FuzzShellStreamItem feeds arbitrary bytes to the generated subscribeShell item decoder: it must
// return an error or a value, never panic, and what it accepts must survive encoding and decoding
// again. Seeds: every recorded shell stream item.
func FuzzShellStreamItem(f *testing.F) {
	for _, v := range replayFrames(f, loadRecordings(f), counter{}).shellItems {
		f.Add(v)
	}
	f.Add([]byte(`{"kind":"thread.updated","sequence":1,"location":"active","thread":{"id":"t","projectId":"p","title":"","status":"idle","pendingRuntimeRequest":null}}`))
	f.Add([]byte(`{"kind":"some-future-kind","sequence":9}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var it t3rpc.ShellStreamItem
		if it.UnmarshalJSON(data) != nil {
			return
		}
		_ = it.Validate()
		roundTrip(t, &it, new(t3rpc.ShellStreamItem))
	})
}

// FuzzThreadStreamItem does the same for subscribeThread items, and decodes the payload of an
// event item by its type as the watcher does.
func FuzzThreadStreamItem(f *testing.F) {
	for _, v := range replayFrames(f, loadRecordings(f), counter{}).threadItems {
		f.Add(v)
	}
	f.Add([]byte(`{"kind":"unknown-event","sequence":3,"eventType":"thread.future"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var it t3rpc.ThreadStreamItem
		if it.UnmarshalJSON(data) != nil {
			return
		}
		_ = it.Validate()
		roundTrip(t, &it, new(t3rpc.ThreadStreamItem))
		if ev, ok := it.Event.Get(); ok {
			if _, target := eventTarget(ev.Type); target != nil && target.UnmarshalJSON(ev.Payload) == nil {
				if enc, ok := target.(encoder); ok {
					_, _ = enc.MarshalJSON()
				}
			}
		}
	})
}

// roundTrip encodes v and decodes the result into fresh: a decoded value must encode to something
// its own decoder accepts.
func roundTrip(t *testing.T, v, fresh encoder) {
	t.Helper()
	enc, err := v.MarshalJSON()
	if err != nil {
		t.Fatalf("encode a decoded %T: %v", v, err)
	}
	if err := fresh.UnmarshalJSON(enc); err != nil {
		t.Fatalf("%T does not decode its own encoding: %v\n%s", v, err, enc)
	}
}
