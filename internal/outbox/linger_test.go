package outbox

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// connReceiver is a webhook receiver on 127.0.0.1 that counts the connections the outbox opens
// and closes, and answers a round of requests only once all of the round are in flight (so that
// more than baseRequests are: the burst client carries some).
type connReceiver struct {
	srv            *httptest.Server
	mu             sync.Mutex
	opened, closed int
	arrived        int
	round          int           // requests a round holds until all are in
	release        chan struct{} // closed when the current round is complete
}

func newConnReceiver(t *testing.T, round int) *connReceiver {
	rc := &connReceiver{round: round, release: make(chan struct{})}
	rc.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		rc.arrived++
		rel := rc.release
		if rc.arrived%rc.round == 0 {
			close(rel)
			rc.release = make(chan struct{})
		}
		rc.mu.Unlock()
		select {
		case <-rel:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	rc.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		switch st {
		case http.StateNew:
			rc.opened++
		case http.StateClosed, http.StateHijacked:
			rc.closed++
		}
	}
	rc.srv.Start()
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *connReceiver) conns() (opened, closed int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.opened, rc.closed
}

// roundOf makes one event on each of n streams, numbered n.
func roundOf(streams, n int) []store.Event {
	evs := make([]store.Event, 0, streams)
	for s := range streams {
		evs = append(evs, mkEvent("m/t"+string(rune('a'+s)), n))
	}
	return evs
}

// An outbox that has just delivered everything keeps its delivery workers and its connections
// to the receiver while it lingers idle: the next events (at 1,000 transitions/s, those of the
// next group commit, milliseconds later) go out on the connections already open, with no dial
// and accept on their way. It once dropped the burst client's connections at every idle turn.
//
// Both ways of sending: net/http's clients (a proxy from the environment, Config.HTTPClient) and
// the fasthttp poster (post.go), whose connections stay open idleConnFor whatever the loop does.
func TestIdleMomentKeepsTheReceiversConnections(t *testing.T) {
	t.Run("net/http", func(t *testing.T) { testIdleMomentKeepsConnections(t, false) })
	t.Run("poster", func(t *testing.T) { testIdleMomentKeepsConnections(t, true) })
}

func testIdleMomentKeepsConnections(t *testing.T, poster bool) {
	const streams = 4 // > baseRequests: two go out on the burst client
	rc := newConnReceiver(t, streams)
	idle := make(chan struct{}, 1)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, func(o *Outbox) {
		if !poster {
			o.fast = nil
		}
		o.idleLinger = time.Hour
		o.onIdle = func() {
			select {
			case idle <- struct{}{}:
			default:
			}
		}
	})
	h.commit(t, roundOf(streams, 1)...)
	h.delivered(t, streams)
	<-idle // the loop found itself idle after the round (and, lingering, shed nothing)
	opened, closed := rc.conns()
	if opened < streams {
		t.Fatalf("%d connections for %d requests in flight at once", opened, streams)
	}
	h.commit(t, roundOf(streams, 2)...)
	h.delivered(t, 2*streams)
	if o2, c2 := rc.conns(); o2 != opened || c2 != closed {
		t.Fatalf("after an idle moment: connections opened %d → %d, closed %d → %d; want none", opened, o2, closed, c2)
	}
}

// Idle for longer than the linger, the outbox drops the burst client's idle connections (and
// ends its waiting workers): an idle connector keeps no pool a burst left behind. Events after
// that are delivered as before. (net/http's clients; the fasthttp poster closes a connection
// idle for idleConnFor itself.)
func TestIdleOutboxDropsTheBurstsConnections(t *testing.T) {
	const streams = 4
	rc := newConnReceiver(t, streams)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, func(o *Outbox) {
		o.fast = nil
		o.idleLinger = time.Millisecond
	})
	h.commit(t, roundOf(streams, 1)...)
	h.delivered(t, streams)
	// The burst's two connections close; the base client's stay open.
	eventually(t, "the burst's connections closed", func() bool { _, c := rc.conns(); return c >= streams-baseRequests })
	h.commit(t, roundOf(streams, 2)...)
	h.delivered(t, 2*streams)
}
