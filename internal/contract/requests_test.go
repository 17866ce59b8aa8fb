package contract

import (
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// TestRuntimeRequestShapes checks what the connector reads of runtime requests in the recordings
// of an approval (18) and a form elicitation (19): every request says whether it can be answered
// (responseCapability), approvals carry a kind other than user_input and an approval_request item
// with requestKind and prompt but no options, and an elicitation is a user_input request whose
// question has options.
func TestRuntimeRequestShapes(t *testing.T) {
	r := replayFrames(t, loadRecordings(t), counter{})
	kinds := map[string]int{}
	capabilities := map[string]int{}
	approvalItems, questionItems := 0, 0
	for _, raw := range r.threadItems {
		var it t3rpc.ThreadStreamItem
		if err := decode(&it, raw); err != nil {
			continue // TestRecordedFramesDecode reports it
		}
		ev, ok := it.Event.Get()
		if !ok {
			continue
		}
		switch ev.Type {
		case "runtime-request.updated":
			var rr t3rpc.RuntimeRequest
			if err := decode(&rr, ev.Payload); err != nil {
				t.Fatalf("runtime request: %v", err)
			}
			kinds[rr.Kind]++
			c, ok := rr.ResponseCapability.Get()
			if !ok {
				t.Errorf("runtime request %s has no responseCapability", rr.ID)
				continue
			}
			capabilities[c.Type]++
			if c.Type == "live" && c.ProviderSessionId.Or("") == "" {
				t.Errorf("live runtime request %s names no provider session", rr.ID)
			}
		case "turn-item.updated":
			var ti t3rpc.TurnItem
			if err := decode(&ti, ev.Payload); err != nil {
				t.Fatalf("turn item: %v", err)
			}
			switch ti.Type {
			case "approval_request":
				approvalItems++
				if ti.RequestKind.Or("") == "" || ti.Prompt.Or("") == "" || ti.RequestId.Or("") == "" {
					t.Errorf("approval_request item %s lacks requestId/requestKind/prompt", ti.ID)
				}
				if len(ti.Questions) != 0 {
					t.Errorf("approval_request item %s lists questions", ti.ID)
				}
			case "user_input_request":
				questionItems++
				for _, q := range ti.Questions {
					if q.ID == "" || q.Question == "" {
						t.Errorf("user_input_request item %s has a question without id or text", ti.ID)
					}
				}
			}
		}
	}
	if kinds["command"] == 0 || kinds["user_input"] == 0 {
		t.Errorf("request kinds seen %v, want command (18) and user_input (06, 19)", kinds)
	}
	if capabilities["live"] == 0 {
		t.Errorf("response capabilities seen %v, want live", capabilities)
	}
	if approvalItems == 0 || questionItems == 0 {
		t.Errorf("approval items %d, question items %d: both must be recorded", approvalItems, questionItems)
	}
	t.Logf("kinds %v, capabilities %v", kinds, capabilities)
}
