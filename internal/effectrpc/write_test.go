package effectrpc

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// A write the peer does not take (it stopped reading: the socket's buffers fill) closes the
// connection once it has taken WriteTimeout: the call writing returns an error wrapping ErrClosed
// that says why, and so does the connection.
func TestStuckWriteClosesTheConnection(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer func() { _ = ws.CloseNow() }()
		<-stop // reads nothing
	}))
	defer srv.Close()
	defer close(stop)
	// No Ping within the test: the peer reads nothing, so it never answers one, and on a starved
	// machine (encoding 16 MiB under the race detector took seconds) the Pong's deadline could
	// close the socket before the write's timeout does.
	c, err := Dial(tctx(t), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", Options{WriteTimeout: 100 * time.Millisecond, PingInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	// More than the loopback socket's buffers hold.
	big := json.RawMessage(`"` + strings.Repeat("x", 16<<20) + `"`)
	err = c.Call(tctx(t), "test.big", big, nil)
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "stopped reading") {
		t.Fatalf("Call = %v, want the write's timeout (ErrClosed)", err)
	}
	<-c.Done()
	if err := c.Err(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "stopped reading") {
		t.Fatalf("Err = %v", err)
	}
}
