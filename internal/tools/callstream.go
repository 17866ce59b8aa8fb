package tools

import (
	"crypto/rand"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CallStreamHeader names, on a POST /mcp that carries one tools/call, the
// call's answer stream (OpenCallStream). The HTTP layer sets it, replacing
// whatever a client sent, and the go-sdk hands the request's header to the
// tool (CallToolRequest.Extra.Header), so a tool can reach its own answer's
// stream; a client cannot name another request's stream (the names are random
// and never sent back).
const CallStreamHeader = "T3code-Mcp-Call-Stream"

// callStreams maps a call stream's name to what sends its answer's headers.
var callStreams sync.Map // string -> func()

// OpenCallStream names the answer stream of the POST whose header h is and
// registers sendHeaders for it: sendHeadersEarly calls it when the call is
// about to block (a t3_wait whose run is not over), so that the response's
// status and headers are on their way before the answer, and at the answer
// the client reads one event instead of the headers and the event (one
// goroutine hand-off fewer in a go-sdk client, its HTTP read loop's). close
// ends the registration; call it when the request is over.
func OpenCallStream(h http.Header, sendHeaders func()) (close func()) {
	name := rand.Text()
	h.Set(CallStreamHeader, name)
	callStreams.Store(name, sendHeaders)
	return func() { callStreams.Delete(name) }
}

// sendHeadersEarly sends the headers of the call's answer stream now, when the
// HTTP layer opened one for it (OpenCallStream); a no-op otherwise (a call
// from another transport, a batch, a test calling the handler directly).
func sendHeadersEarly(req *mcp.CallToolRequest) {
	if req != nil && req.Extra != nil {
		SendCallHeaders(req.Extra.Header)
	}
}

// SendCallHeaders sends the answer's headers of the call stream that the
// request header h names (OpenCallStream), if it is still open.
func SendCallHeaders(h http.Header) {
	name := h.Get(CallStreamHeader)
	if name == "" {
		return
	}
	if f, ok := callStreams.Load(name); ok {
		f.(func())()
	}
}
