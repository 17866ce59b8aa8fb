package contract

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// request is one recorded Request frame and what T3 answered to it.
type request struct {
	where   string // file and frame index
	id      string
	method  string // RPC method (the Request's tag)
	cmdType string // payload.type of a dispatchCommand
	payload []byte

	target    string // generated type of the payload, "" when t3code-mcp never sends it
	decodeErr error  // decoding the payload with target
	chunks    int
	exit      *t3rpc.ExitResult
}

// wsReplay is what replaying the recorded frames collected.
type wsReplay struct {
	requests    []*request
	shellItems  [][]byte // Chunk values of subscribeShell streams
	threadItems [][]byte // Chunk values of subscribeThread streams
}

const (
	methodDispatch       = "orchestration.dispatchCommand"
	methodLaunchThread   = "orchestration.launchThread"
	methodSubscribeShell = "orchestration.subscribeShell"
	// methodSubscribeArchived streams the archived threads' rows with the same items as
	// subscribeShell (fixture 23); t3code-mcp does not subscribe to it, but its items must decode
	// as ShellStreamItem all the same.
	methodSubscribeArchived = "orchestration.subscribeArchivedShell"
	methodSubscribeThread   = "orchestration.subscribeThread"
	methodGetProjection     = "orchestration.getThreadProjection"
	methodArchivedShell     = "orchestration.getArchivedShellSnapshot"
	methodGetConfig         = "server.getConfig"
)

// payloadTarget returns the generated type of a Request payload, or "" for a method t3code-mcp
// never calls (or a command type it never sends).
func payloadTarget(method, cmdType string) (string, decoder) {
	switch method {
	case methodDispatch:
		switch cmdType {
		case "thread.create":
			return "ThreadCreateCommand", new(t3rpc.ThreadCreateCommand)
		case "message.dispatch":
			return "MessageDispatchCommand", new(t3rpc.MessageDispatchCommand)
		case "run.interrupt":
			return "RunInterruptCommand", new(t3rpc.RunInterruptCommand)
		case "runtime-request.respond":
			return "RuntimeRequestRespondCommand", new(t3rpc.RuntimeRequestRespondCommand)
		case "thread.model-selection.set":
			return "ThreadModelSelectionSetCommand", new(t3rpc.ThreadModelSelectionSetCommand)
		}
	case methodLaunchThread:
		return "LaunchThreadInput", new(t3rpc.LaunchThreadInput)
	case methodSubscribeShell, methodSubscribeArchived:
		return "SubscribeShellInput", new(t3rpc.SubscribeShellInput)
	case methodSubscribeThread:
		return "SubscribeThreadInput", new(t3rpc.SubscribeThreadInput)
	case methodGetProjection:
		return "GetThreadProjectionInput", new(t3rpc.GetThreadProjectionInput)
	}
	return "", nil
}

// successTarget returns the generated type of a call's Exit Success value.
func successTarget(method string) (string, decoder) {
	switch method {
	case methodDispatch:
		return "DispatchResult", new(t3rpc.DispatchResult)
	case methodLaunchThread:
		return "LaunchThreadResult", new(t3rpc.LaunchThreadResult)
	case methodGetConfig:
		return "ServerConfig", new(t3rpc.ServerConfig)
	case methodGetProjection:
		return "ThreadProjection", new(t3rpc.ThreadProjection)
	case methodArchivedShell:
		return "ShellSnapshot", new(t3rpc.ShellSnapshot)
	}
	return "", nil
}

// eventTarget returns the generated type of a domain event's payload by event type.
func eventTarget(eventType string) (string, decoder) {
	switch eventType {
	case "run.created", "run.updated":
		return "Run", new(t3rpc.Run)
	case "turn-item.updated":
		return "TurnItem", new(t3rpc.TurnItem)
	case "runtime-request.updated":
		return "RuntimeRequest", new(t3rpc.RuntimeRequest)
	case "message.updated":
		return "Message", new(t3rpc.Message)
	case "checkpoint.captured":
		return "Checkpoint", new(t3rpc.Checkpoint)
	}
	return "", nil
}

// replayFrames decodes every recorded WebSocket frame, reporting each failure through t.Errorf and
// counting each decoded item in c.
func replayFrames(t testing.TB, recs []recording, c counter) *wsReplay {
	t.Helper()
	out := &wsReplay{}
	for _, rec := range recs {
		byID := map[string]*request{}
		for i, fr := range rec.Frames {
			where := fmt.Sprintf("%s frame %d (%s)", rec.file, i, fr.Dir)
			if fr.Dir == "event" {
				c.add("skipped: socket event note (open/close)")
				continue
			}
			msgs, err := splitFrame([]byte(fr.Data))
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			c.add("frame " + fr.Dir)
			for _, m := range msgs {
				switch fr.Dir {
				case "send":
					replaySend(t, where, m, byID, out, c)
				case "recv":
					replayRecv(t, where, m, byID, out, c)
				default:
					t.Errorf("%s: unknown frame direction", where)
				}
			}
		}
	}
	return out
}

func replaySend(t testing.TB, where string, m []byte, byID map[string]*request, out *wsReplay, c counter) {
	t.Helper()
	var msg t3rpc.ClientMessage
	if err := decode(&msg, m); err != nil {
		t.Errorf("%s: ClientMessage: %v\n%.300s", where, err, m)
		return
	}
	c.add("ClientMessage")
	c.add("ClientMessage " + string(msg.Type))
	switch {
	case msg.IsRequest():
		req, _ := msg.GetRequest()
		r := &request{where: where, id: requestKey(req.ID), method: req.Method, payload: []byte(req.Payload)}
		if r.method == methodDispatch {
			var head struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(r.payload, &head); err != nil {
				t.Errorf("%s: dispatchCommand payload: %v", where, err)
			}
			r.cmdType = head.Type
		}
		if _, dup := byID[r.id]; dup {
			t.Errorf("%s: request id %s used twice on one socket", where, r.id)
		}
		byID[r.id] = r
		out.requests = append(out.requests, r)
		name, target := payloadTarget(r.method, r.cmdType)
		if target == nil {
			c.add(strings.TrimSpace(fmt.Sprintf("skipped: payload without a generated type: %s %s", r.method, r.cmdType)))
			return
		}
		r.target = name
		if r.decodeErr = decode(target, r.payload); r.decodeErr == nil {
			c.add("payload " + name)
		}
		// A payload that does not decode is judged once T3's answer is known (checkRejections).
	case msg.IsAck():
		ack, _ := msg.GetAck()
		if byID[requestKey(ack.RequestId)] == nil {
			t.Errorf("%s: Ack for unknown request %s", where, requestKey(ack.RequestId))
		}
	case msg.IsInterrupt():
		in, _ := msg.GetInterrupt()
		if byID[requestKey(in.RequestId)] == nil {
			t.Errorf("%s: Interrupt for unknown request %s", where, requestKey(in.RequestId))
		}
	}
}

func replayRecv(t testing.TB, where string, m []byte, byID map[string]*request, out *wsReplay, c counter) {
	t.Helper()
	var msg t3rpc.ServerMessage
	if err := decode(&msg, m); err != nil {
		t.Errorf("%s: ServerMessage: %v\n%.300s", where, err, m)
		return
	}
	c.add("ServerMessage")
	c.add("ServerMessage " + string(msg.Type))
	switch {
	case msg.IsChunk():
		ch, _ := msg.GetChunk()
		r := byID[requestKey(ch.RequestId)]
		if r == nil {
			t.Errorf("%s: Chunk for unknown request %s", where, requestKey(ch.RequestId))
			return
		}
		r.chunks++
		for j, v := range ch.Values {
			w := fmt.Sprintf("%s value %d", where, j)
			switch r.method {
			case methodSubscribeShell, methodSubscribeArchived:
				out.shellItems = append(out.shellItems, []byte(v))
				var it t3rpc.ShellStreamItem
				if err := decode(&it, v); err != nil {
					t.Errorf("%s: ShellStreamItem: %v\n%.300s", w, err, v)
					continue
				}
				c.add("ShellStreamItem")
				c.add("ShellStreamItem kind " + it.Kind)
			case methodSubscribeThread:
				out.threadItems = append(out.threadItems, []byte(v))
				var it t3rpc.ThreadStreamItem
				if err := decode(&it, v); err != nil {
					t.Errorf("%s: ThreadStreamItem: %v\n%.300s", w, err, v)
					continue
				}
				c.add("ThreadStreamItem")
				c.add("ThreadStreamItem kind " + it.Kind)
				if ev, ok := it.Event.Get(); ok {
					decodeEvent(t, w, ev, c)
				}
			default:
				t.Errorf("%s: Chunk for %s, which is not a stream t3code-mcp knows", w, r.method)
			}
		}
	case msg.IsExit():
		ex, _ := msg.GetExit()
		r := byID[requestKey(ex.RequestId)]
		if r == nil {
			t.Errorf("%s: Exit for unknown request %s", where, requestKey(ex.RequestId))
			return
		}
		r.exit = &ex.Exit
		if s, ok := ex.Exit.GetExitSuccess(); ok {
			decodeSuccess(t, where, r, s.Value, c)
		}
		if f, ok := ex.Exit.GetExitFailure(); ok {
			c.add("ExitFailure")
			for _, cause := range f.Cause {
				tag := cause.Tag
				if e, ok := cause.Error.Get(); ok {
					tag += " " + e.Tag
				}
				c.add("ExitFailure cause " + tag)
			}
		}
	}
}

func decodeEvent(t testing.TB, where string, ev t3rpc.DomainEvent, c counter) {
	t.Helper()
	name, target := eventTarget(ev.Type)
	if target == nil {
		c.add("skipped: event payload " + ev.Type + " (not read by t3code-mcp)")
		return
	}
	if err := decode(target, ev.Payload); err != nil {
		t.Errorf("%s: %s payload as %s: %v\n%.300s", where, ev.Type, name, err, ev.Payload)
		return
	}
	c.add("event payload " + name)
}

func decodeSuccess(t testing.TB, where string, r *request, value jx.Raw, c counter) {
	t.Helper()
	if len(value) == 0 || string(value) == "null" {
		c.add("Exit Success without value (end of stream)")
		return
	}
	name, target := successTarget(r.method)
	if target == nil {
		c.add("skipped: Success value without a generated type: " + r.method)
		return
	}
	if err := decode(target, value); err != nil {
		t.Errorf("%s: Success value of %s as %s: %v\n%.300s", where, r.method, name, err, value)
		return
	}
	c.add("Success " + name)
}

// checkRejections judges the sent payloads that our types did not decode. That is fine only where
// T3 refused the payload as well (a Die defect, no stream items: the recording sends some broken
// payloads on purpose) or never looked at it (authorization failed first). A command payload that
// our type decodes but T3 refused as malformed means our schema is looser than T3's.
func checkRejections(t *testing.T, reqs []*request, c counter) {
	t.Helper()
	for _, r := range reqs {
		if r.target == "" {
			continue
		}
		died, unauthorized := false, false
		if r.exit != nil {
			if f, ok := r.exit.GetExitFailure(); ok {
				for _, cause := range f.Cause {
					if cause.Tag == "Die" {
						died = true
					}
					if e, ok := cause.Error.Get(); ok && e.Tag == "EnvironmentAuthorizationError" {
						unauthorized = true
					}
				}
			}
		}
		isCommand := r.method == methodDispatch || r.method == methodLaunchThread
		switch {
		case r.decodeErr == nil && isCommand && died && r.chunks == 0:
			t.Errorf("%s: T3 refused this %s payload as malformed, but %s accepts it: the schema is looser than T3\n%s",
				r.where, r.method, r.target, r.payload)
		case r.decodeErr == nil:
		case died && r.chunks == 0:
			c.add("rejected by T3 and by " + r.target)
		case unauthorized:
			c.add("not decoded, T3 refused authorization before decoding: " + r.target)
		default:
			t.Errorf("%s: %s payload does not decode as %s: %v\n%s", r.where, r.method, r.target, r.decodeErr, r.payload)
		}
	}
}

// TestRecordedFramesDecode decodes every recorded WebSocket frame: client messages and their
// payloads, server messages, stream items by the stream they belong to, domain event payloads by
// type, and call results by method.
func TestRecordedFramesDecode(t *testing.T) {
	c := counter{}
	r := replayFrames(t, loadRecordings(t), c)
	checkRejections(t, r.requests, c)
	c.log(t)
	c.requirePositive(t,
		"ClientMessage", "ServerMessage", "ServerMessage Chunk", "ServerMessage Exit",
		"ShellStreamItem", "ThreadStreamItem",
		"event payload Run", "event payload TurnItem", "event payload RuntimeRequest",
		"event payload Message", "event payload Checkpoint",
		"Success DispatchResult", "Success LaunchThreadResult", "Success ServerConfig",
		"ExitFailure",
		"payload ThreadCreateCommand", "payload MessageDispatchCommand", "payload RunInterruptCommand",
		"payload RuntimeRequestRespondCommand", "payload LaunchThreadInput",
		"payload SubscribeShellInput", "payload SubscribeThreadInput",
		"rejected by T3 and by MessageDispatchCommand",
	)
}

// TestArrayFrame checks that a frame holding a JSON array of messages is split and each message
// decodes: T3 may batch messages that way (recordings so far hold single messages only).
func TestArrayFrame(t *testing.T) {
	var recv []string
	for _, rec := range loadRecordings(t) {
		for _, fr := range rec.Frames {
			if fr.Dir == "recv" && len(recv) < 3 {
				recv = append(recv, fr.Data)
			}
		}
	}
	if len(recv) < 3 {
		t.Fatal("not enough recorded recv frames")
	}
	msgs, err := splitFrame([]byte(" [" + strings.Join(recv, ",") + "]"))
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(recv) {
		t.Fatalf("split %d messages, want %d", len(msgs), len(recv))
	}
	for i, m := range msgs {
		var msg t3rpc.ServerMessage
		if err := decode(&msg, m); err != nil {
			t.Errorf("message %d of an array frame: %v", i, err)
		}
	}
	if _, err := splitFrame([]byte(`{"_tag":"Pong"`)); err == nil {
		t.Error("a truncated frame was accepted")
	}
}
