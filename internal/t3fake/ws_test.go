package t3fake

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// The reader reads every frame into one buffer it keeps: nothing decoded from a frame may point
// into it. A message's text, dispatched first, is still whole after later frames (the same
// length, other bytes; one larger than the kept buffer) were read over it.
func TestFramesReadIntoOneBufferKeepNothingOfIt(t *testing.T) {
	s := StartT(t, Options{})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	texts := map[string]string{
		"thread-a": strings.Repeat("a", 3000),
		"thread-b": strings.Repeat("b", 3000),
		"thread-c": strings.Repeat("c", maxReadBuffer+1000),
		"thread-d": strings.Repeat("d", 3000),
	}
	for i, tid := range []string{"thread-a", "thread-b", "thread-c", "thread-d"} {
		c.success(c.call("orchestration.dispatchCommand", createThreadPayload(fmt.Sprintf("c-create-%d", i), tid, pid)))
		c.success(c.call("orchestration.dispatchCommand", dispatchPayload(fmt.Sprintf("c-run-%d", i), tid, fmt.Sprintf("m-%d", i), texts[tid])))
	}
	for tid, text := range texts {
		var p t3rpc.ThreadProjection
		if err := p.Decode(jx.DecodeBytes(c.success(c.call("orchestration.getThreadProjection", fmt.Sprintf(`{"threadId":%q}`, tid))))); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range p.Messages {
			if m.Role == "user" {
				found = true
				if m.Text != text {
					t.Errorf("%s: user message of %d bytes starts %.20q, want %d bytes of %q", tid, len(m.Text), m.Text, len(text), text[:1])
				}
			}
		}
		if !found {
			t.Errorf("%s: no user message", tid)
		}
	}
}
