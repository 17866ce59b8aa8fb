// Package effectrpc is the client side of Effect RPC's JSON protocol over one
// WebSocket, as spoken by T3 Code on /ws: requests multiplexed by id, streams
// with Chunk → handler → Ack flow control, Ping/Pong liveness, Interrupt on
// cancel, and Exit causes mapped to Go errors. It knows nothing about T3's
// methods; the wire messages are the generated types in gen/t3rpc.
package effectrpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Defaults for Options.
const (
	DefaultPingInterval = 5 * time.Second
	// defaultReadLimit is the largest frame accepted. T3 sends whole thread
	// projections and shell snapshots in one frame; the library default of 32 KiB
	// would kill the socket on the first real snapshot.
	defaultReadLimit    = 64 << 20
	defaultWriteTimeout = 10 * time.Second
)

// Options configure Dial. The zero value is usable.
type Options struct {
	// PingInterval is how often a Ping is sent (while none is unanswered).
	// Default 5s.
	PingInterval time.Duration
	// PongTimeout is how long a Ping may wait for its Pong before the socket
	// is treated as dead and closed. Default 2 × PingInterval: a Pong late by
	// up to one interval (a starved machine, a big frame read ahead of it) is
	// tolerated, where Effect's own client gives up at the next tick.
	PongTimeout time.Duration
	// ReadLimit is the largest frame accepted, in bytes. Default 64 MiB.
	ReadLimit int64
	// WriteTimeout bounds one frame write. A write that cannot finish in time
	// means the peer stopped reading; the socket is closed. Default 10s.
	WriteTimeout time.Duration
	// HTTPClient performs the upgrade request. Default http.DefaultClient.
	HTTPClient *http.Client
	// Header is sent with the upgrade request.
	Header http.Header
	// Logger receives debug and warning lines; default discards.
	Logger *slog.Logger
	// Label names the peer (a machine name) in log lines; callers read it back
	// with Conn.Label to say which machine an error came from.
	Label string
	// Tap, when set, sees every frame: dir "send" or "recv" and the raw text.
	// The traffic recorder (scripts/record) uses it; it must not block, and
	// must copy what it keeps (a received frame's buffer is reused).
	Tap func(dir string, data []byte)
}

func (o Options) withDefaults() Options {
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.PongTimeout <= 0 {
		o.PongTimeout = 2 * o.PingInterval
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = defaultReadLimit
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = defaultWriteTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Conn is one Effect RPC WebSocket. All methods are safe for concurrent use.
type Conn struct {
	ws           *websocket.Conn
	label        string
	log          *slog.Logger
	pingInterval time.Duration
	pongTimeout  time.Duration
	writeTimeout time.Duration
	tap          func(dir string, data []byte)

	mu      sync.Mutex
	nextID  uint64
	pending map[string]*call
	err     error // why the connection closed; nil while open
	done    chan struct{}

	// lastFrame is the size of the last frame read (readFrame; the read loop's own).
	lastFrame int

	// The read loop's own: the Acks it owes (each stream's encoded Ack), written together once no
	// whole frame waits to be read (flushAcks), and the buffer they are joined in. peek, when set,
	// is the socket's TCP connection, which tells whether a whole frame waits (peekConn).
	acks   [][]byte
	ackBuf []byte
	peek   *peekConn

	// awaitingPong is set when a Ping goes out and cleared by the Pong.
	awaitingPong atomic.Bool
	wg           sync.WaitGroup

	// One frame is written at a time (wmu); writeStart is when the one being written began (0:
	// none), and writeWatch, one timer per connection, fails the connection when a write has
	// taken writeTimeout (writeOverdue): a context with a deadline per write made a timer and a
	// context.AfterFunc in the library for every Ack.
	wmu        sync.Mutex
	writeStart atomic.Int64
	writeWatch *time.Timer
}

// call is one in-flight request. The read loop appends events to its queue and
// never blocks on it; the caller's goroutine (inside Call or Stream) consumes
// them in order. That keeps a slow stream handler from holding up the read
// loop, other streams or unary replies.
type call struct {
	id     string
	method string
	// borrow: the handler gets chunk values as slices of the frame's buffer, lent until it
	// returns (StreamChunks); otherwise copies it may keep (Stream).
	borrow bool
	// ahead > 0: a Chunk is acknowledged by the read loop as it is queued, while at most ahead
	// wait for the handler (StreamAhead); 0: after the handler returns.
	ahead int
	// inline, when set, is the handler the read loop itself runs on each Chunk (StreamInline).
	inline func(Chunk) (rest func() error)
	// ackFrame is the stream's Ack, encoded once: every Ack of a stream is the same message.
	ackFrame []byte

	// onRead, when set, may take a Chunk on the read loop itself, before it is queued
	// (StreamAheadOnRead): only while nothing of the stream is queued or in the handler, so the
	// stream's order is kept.
	onRead func(values []jx.Raw) (taken bool, err error)

	mu    sync.Mutex
	queue []event
	// handling: the handler has a Chunk it popped and has not returned from it yet, or the
	// read loop is in onRead.
	handling bool
	// owed: a Chunk of an ahead stream came while ahead others waited; its Ack goes out once
	// the handler has taken one, as it takes it (only one can be owed: T3 sends nothing more
	// until it has it).
	owed bool
	// behind counts an inline stream's Chunks handed to the stream's goroutine and not yet done
	// there (their rest, or the whole handler of a Chunk that came meanwhile).
	behind int
	wake   chan struct{} // capacity 1: "the queue may have grown"
}

// event is a Chunk (values) or the terminal Exit (end).
type event struct {
	values []jx.Raw
	// frame, when set, holds values: released once the handler is done with them.
	frame *frame
	read  time.Time // when the frame that carried it was read off the socket
	end   bool
	value jx.Raw // success value of the Exit
	err   error  // failure of the Exit
	// failed: onRead failed on a Chunk (err): the stream ends as when its handler fails.
	failed bool
	// rest is what the read loop left of an inline stream's Chunk for the stream's goroutine;
	// whole marks an inline stream's Chunk whose handler runs there entirely (StreamInline).
	rest  func() error
	whole bool
}

func (cl *call) push(ev event) {
	cl.mu.Lock()
	cl.queue = append(cl.queue, ev)
	cl.mu.Unlock()
	select {
	case cl.wake <- struct{}{}:
	default:
	}
}

// pushChunk queues a Chunk and reports whether its Ack is to go out now (an ahead stream with
// room); otherwise, for an ahead stream, the Ack is owed until the handler makes room.
func (cl *call) pushChunk(ev event) (ackNow bool) {
	cl.mu.Lock()
	cl.queue = append(cl.queue, ev)
	if cl.ahead > 0 {
		if ackNow = len(cl.queue) <= cl.ahead; !ackNow {
			cl.owed = true
		}
	}
	cl.mu.Unlock()
	select {
	case cl.wake <- struct{}{}:
	default:
	}
	return ackNow
}

// pushBehind queues an inline stream's Chunk for the stream's goroutine (its rest, or the whole
// handler), counted behind until done.
func (cl *call) pushBehind(ev event) {
	cl.mu.Lock()
	cl.queue = append(cl.queue, ev)
	cl.behind++
	cl.mu.Unlock()
	select {
	case cl.wake <- struct{}{}:
	default:
	}
}

// isBehind reports whether the stream's goroutine still has a Chunk of this inline stream to do.
func (cl *call) isBehind() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.behind > 0
}

// caughtUp notes that the stream's goroutine is done with a Chunk it was handed.
func (cl *call) caughtUp() {
	cl.mu.Lock()
	cl.behind--
	cl.mu.Unlock()
}

// payOwed reports whether an owed Ack may go out now that the handler took a chunk.
func (cl *call) payOwed() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.owed && len(cl.queue) <= cl.ahead {
		cl.owed = false
		return true
	}
	return false
}

func (cl *call) pop() (event, bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if len(cl.queue) == 0 {
		return event{}, false
	}
	ev := cl.queue[0]
	cl.queue[0] = event{}
	cl.queue = cl.queue[1:]
	cl.handling = !ev.end && !ev.failed
	return ev, true
}

// handled: the handler returned from the Chunk it popped.
func (cl *call) handled() {
	cl.mu.Lock()
	cl.handling = false
	cl.mu.Unlock()
}

// takeOnRead offers a Chunk to onRead on the read loop and reports whether it took it (or
// failed on it: the failure is queued for the stream's goroutine, which ends the stream). It
// is offered only while nothing of the stream waits in the queue or in the handler.
func (cl *call) takeOnRead(values []jx.Raw) (taken, failed bool) {
	cl.mu.Lock()
	if cl.onRead == nil || len(cl.queue) > 0 || cl.handling {
		cl.mu.Unlock()
		return false, false
	}
	cl.handling = true
	cl.mu.Unlock()
	taken, err := cl.onRead(values)
	cl.mu.Lock()
	cl.handling = false
	if err != nil {
		cl.queue = append(cl.queue, event{failed: true, err: err})
	}
	cl.mu.Unlock()
	if err != nil {
		select {
		case cl.wake <- struct{}{}:
		default:
		}
		return true, true
	}
	return taken, false
}

// Dial opens the WebSocket at url (ws://, wss://, http:// or https://) and
// starts the read and ping loops. A handshake answered with anything but 101
// returns *UpgradeError. The URL's query (it carries the wsTicket) never
// appears in an error.
func Dial(ctx context.Context, url string, opts Options) (*Conn, error) {
	opts = opts.withDefaults()
	hc, peeked := peekClient(opts.HTTPClient, url)
	if peeked != nil {
		// The handshake's transport is a clone no one else uses: a refused upgrade's connection,
		// its answer read to the end, would wait in its idle pool until the idle timeout.
		defer hc.CloseIdleConnections()
	}
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient: hc,
		HTTPHeader: opts.Header,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var body []byte
			if resp.Body != nil {
				body, _ = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			}
			return nil, &UpgradeError{Status: resp.StatusCode, Body: body}
		}
		return nil, redact(fmt.Errorf("effectrpc: dial %s: %w", safeURL(url), err), url)
	}
	ws.SetReadLimit(opts.ReadLimit)

	log := opts.Logger
	if opts.Label != "" {
		log = log.With("peer", opts.Label)
	}
	c := &Conn{
		ws:           ws,
		label:        opts.Label,
		log:          log,
		pingInterval: opts.PingInterval,
		pongTimeout:  opts.PongTimeout,
		writeTimeout: opts.WriteTimeout,
		tap:          opts.Tap,
		pending:      make(map[string]*call),
		done:         make(chan struct{}),
	}
	if peeked != nil {
		if pc := peeked.Load(); pc != nil {
			pc.arm()
			c.peek = pc
		}
	}
	c.writeWatch = time.AfterFunc(time.Hour, c.writeOverdue)
	c.writeWatch.Stop()
	c.wg.Add(2)
	go c.readLoop(opts.ReadLimit)
	go c.pingLoop()
	return c, nil
}

// Label is Options.Label.
func (c *Conn) Label() string { return c.label }

// Done is closed when the connection has closed, for any reason.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why the connection closed: ErrClosed after Close, otherwise an
// error wrapping ErrClosed that names the cause (socket lost, no Pong, a Defect,
// which is also an *Error of KindDefect). It is nil while the connection is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection and waits for its goroutines. In-flight requests
// return ErrClosed. Close is idempotent.
func (c *Conn) Close() error {
	if c.shutdown(ErrClosed) {
		// A close handshake tells T3 to end this connection's subscriptions now
		// rather than when it notices a dead socket.
		_ = c.ws.Close(websocket.StatusNormalClosure, "")
	}
	_ = c.ws.CloseNow()
	c.wg.Wait()
	c.writeWatch.Stop()
	return nil
}

// Call sends a unary request and waits for its Exit. payload is a generated
// type (json.Marshaler, value or pointer), json.RawMessage, or nil for {}.
// result is a pointer to a generated type (json.Unmarshaler), *json.RawMessage,
// or nil to discard the value. A Failure exit returns *Error. When ctx ends
// first, an Interrupt is sent and ctx.Err() returned. A lost socket returns an
// error wrapping ErrClosed: the request may or may not have been handled.
func (c *Conn) Call(ctx context.Context, method string, payload, result any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cl, err := c.start(method, payload, nil)
	if err != nil {
		return err
	}
	for {
		ev, err := c.next(ctx, cl)
		if err != nil {
			return err
		}
		if !ev.end {
			// Unary methods never stream; a stray Chunk is not worth failing for.
			ev.frame.release()
			c.log.Debug("effectrpc: Chunk for a unary request ignored", "method", method, "id", cl.id)
			continue
		}
		if ev.err != nil {
			return ev.err
		}
		if result == nil {
			return nil
		}
		if isNull(ev.value) {
			return &Error{Kind: KindProtocol, Method: method, Message: "success exit carried no value"}
		}
		if err := decodeResult(ev.value, result); err != nil {
			return &Error{Kind: KindProtocol, Method: method, Message: "cannot decode the result: " + err.Error()}
		}
		return nil
	}
}

// Stream sends a stream request and blocks until the stream ends. onChunk gets
// each Chunk's values in arrival order, on the calling goroutine, one at a
// time; the Ack that lets T3 send the next Chunk goes out only after onChunk
// returns nil, so nothing new arrives until the last batch is applied. The
// values are onChunk's to keep (StreamChunks lends them instead).
//
// Stream returns nil on an Exit Success, *Error on a Failure, ctx.Err() after
// sending an Interrupt when ctx ends, onChunk's error (after an Interrupt) when
// it fails, and an error wrapping ErrClosed when the socket goes away.
func (c *Conn) Stream(ctx context.Context, method string, payload any, onChunk func(values []jx.Raw) error) error {
	return c.stream(ctx, method, payload, &streamOpts{}, func(ch Chunk) error { return onChunk(ch.Values) })
}

// StreamAhead is Stream for a stream whose chunks hold nothing T3 must know applied before it
// sends more (a thread's feed, unlike the shell stream, whose Ack follows durability): each
// Chunk is acknowledged by the socket's read loop as soon as it is queued, while at most ahead
// Chunks (≥ 1) wait for onChunk; beyond that the Ack waits until onChunk has taken one. So
// T3's next Chunk is not held behind the handler's turn on a core — on a busy machine that
// turn, not the handler's work, is most of an Ack's round trip — and what is read ahead is
// bounded by ahead + 1 Chunks. The values are onChunk's to keep.
func (c *Conn) StreamAhead(ctx context.Context, method string, payload any, ahead int, onChunk func(values []jx.Raw) error) error {
	return c.stream(ctx, method, payload, &streamOpts{ahead: max(ahead, 1)}, func(ch Chunk) error { return onChunk(ch.Values) })
}

// StreamAheadOnRead is StreamAhead with onRead, offered each Chunk on the socket's read loop
// before it is queued, whenever nothing of the stream waits in the queue or in onChunk (so the
// stream's order is kept): when it takes the Chunk (taken), the Chunk is acknowledged at once
// and never reaches onChunk; when it does not, the Chunk goes to onChunk as with StreamAhead.
// An error from onRead ends the stream as one from onChunk does. onRead runs on the read loop
// that every frame of the socket waits for: it must take only what it can apply in
// microseconds and never block (try a lock, do not wait for one). It saves the hand-off to
// the stream's goroutine — a wait for a core on a busy machine — for a stream whose chunks are
// small, such as a thread's feed after its snapshot. The values are onRead's to keep.
func (c *Conn) StreamAheadOnRead(ctx context.Context, method string, payload any, ahead int, onRead func(values []jx.Raw) (taken bool, err error), onChunk func(values []jx.Raw) error) error {
	return c.stream(ctx, method, payload, &streamOpts{ahead: max(ahead, 1), onRead: onRead}, func(ch Chunk) error { return onChunk(ch.Values) })
}

// Chunk is one Chunk message of a stream.
type Chunk struct {
	Values []jx.Raw
	// Read is when the frame that carried it was read off the socket: the time it then waited
	// for the handler (behind the previous chunk) and the handler's own time are measured from
	// it (the watcher's chunk histograms).
	Read time.Time
}

// StreamChunks is Stream with each chunk's read time, and values that are lent, not given: they
// are slices of the buffer the frame was read into, valid only until onChunk returns (the
// buffer then serves a later frame). A handler that keeps a value, or anything that aliases one,
// must copy it; one that decodes the values into its own types (the watcher) needs no copy, and
// the read loop makes none (decodeChunk).
func (c *Conn) StreamChunks(ctx context.Context, method string, payload any, onChunk func(Chunk) error) error {
	return c.stream(ctx, method, payload, &streamOpts{borrow: true}, onChunk)
}

// StreamInline is StreamChunks with the handler run by the socket's read loop as each Chunk is
// read, not handed to the calling goroutine: a Chunk whose work cannot block is done and
// acknowledged there at once, with no goroutine woken for it. onChunk must not block (it holds up
// every other request of the socket meanwhile); it returns nil when the Chunk is done — the read
// loop then writes its Ack — or the rest of the Chunk's work that may wait (a commit to disk),
// which runs on the calling goroutine, the Ack following once rest returns nil, so that T3 still
// sends nothing more until then. A rest's error ends the stream as onChunk's does in Stream.
//
// The values are lent as in StreamChunks, until onChunk returns or, when it returns a rest, until
// rest returns. A Chunk that comes while a rest is still to run (T3 waits for the Ack, so only a
// server that does not) is handed to the calling goroutine whole, after it, so that the handler
// still sees the Chunks one at a time and in order.
func (c *Conn) StreamInline(ctx context.Context, method string, payload any, onChunk func(Chunk) (rest func() error)) error {
	return c.stream(ctx, method, payload, &streamOpts{borrow: true, inline: onChunk}, nil)
}

func (c *Conn) stream(ctx context.Context, method string, payload any, so *streamOpts, onChunk func(Chunk) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	inline := so.inline
	cl, err := c.start(method, payload, so)
	if err != nil {
		return err
	}
	for {
		ev, err := c.next(ctx, cl)
		if err != nil {
			return err
		}
		if ev.end {
			return ev.err
		}
		if ev.failed {
			c.abandon(cl)
			return ev.err
		}
		// The handler takes this Chunk now: an ahead stream's owed Ack goes out before the
		// handler runs, not after it returns, so that T3 is held back by the queue's bound alone
		// and a handler that waits for a later Chunk is not waiting for its own Ack.
		if cl.ahead > 0 && cl.payOwed() && c.isPending(cl.id) {
			c.ack(cl)
		}
		switch {
		case ev.rest != nil:
			err = ev.rest()
		case ev.whole:
			if rest := inline(Chunk{Values: ev.values, Read: ev.read}); rest != nil {
				err = rest()
			}
		default:
			err = onChunk(Chunk{Values: ev.values, Read: ev.read})
		}
		cl.handled()
		ev.frame.release()
		if inline != nil {
			// Before the Ack: T3 sends the next Chunk once it has it, and the read loop may then
			// run the handler itself.
			cl.caughtUp()
		}
		if err != nil {
			c.abandon(cl)
			return err
		}
		// An ahead stream's Acks went out as its Chunks were queued or taken (above); the
		// others' once the handler is done.
		if cl.ahead == 0 && c.isPending(cl.id) {
			// A failed Ack means the socket is gone; next() then reports it.
			c.ack(cl)
		}
	}
}

// ack sends the Ack of cl's last Chunk.
func (c *Conn) ack(cl *call) {
	_ = c.sendFrame(cl.ackFrame)
}

// streamOpts are a stream request's settings (call's fields of the same names).
type streamOpts struct {
	borrow bool
	ahead  int
	onRead func([]jx.Raw) (bool, error)
	inline func(Chunk) func() error
}

// start registers a request (a stream when so is set) and writes it. The request is registered
// first so that a reply racing the write is never dropped.
func (c *Conn) start(method string, payload any, so *streamOpts) (*call, error) {
	raw, err := encodePayload(payload)
	if err != nil {
		return nil, fmt.Errorf("effectrpc: %s: encode payload: %w", method, err)
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	id := strconv.FormatUint(c.nextID, 10)
	c.nextID++
	cl := &call{id: id, method: method, wake: make(chan struct{}, 1)}
	if so != nil {
		cl.borrow, cl.ahead, cl.onRead, cl.inline = so.borrow, so.ahead, so.onRead, so.inline
		cl.ackFrame = encodeClient(t3rpc.NewAckClientMessage(t3rpc.Ack{RequestId: t3rpc.NewStringRequestId(id)}))
	}
	c.pending[id] = cl
	c.mu.Unlock()

	req := t3rpc.Request{
		ID:      t3rpc.NewStringRequestId(id),
		Method:  method,
		Payload: raw,
		Headers: []t3rpc.Header{},
	}
	if err := c.send(t3rpc.NewRequestClientMessage(req)); err != nil {
		c.forget(id)
		return nil, err
	}
	return cl, nil
}

// next returns the request's next event, or an error when ctx ends (after
// interrupting the request) or the connection closes (after handing out what
// had already arrived).
func (c *Conn) next(ctx context.Context, cl *call) (event, error) {
	for {
		if err := ctx.Err(); err != nil {
			c.abandon(cl)
			return event{}, err
		}
		if ev, ok := cl.pop(); ok {
			return ev, nil
		}
		select {
		case <-cl.wake:
		case <-ctx.Done():
			c.abandon(cl)
			return event{}, ctx.Err()
		case <-c.done:
			if ev, ok := cl.pop(); ok {
				return ev, nil
			}
			return event{}, c.Err()
		}
	}
}

// abandon forgets a request the caller gave up on and, if T3 has not ended it
// yet, sends an Interrupt so T3 stops the work (and, for a stream, stops
// sending). A late Exit for it is ignored.
func (c *Conn) abandon(cl *call) {
	c.mu.Lock()
	_, live := c.pending[cl.id]
	delete(c.pending, cl.id)
	open := c.err == nil
	c.mu.Unlock()
	if !live || !open {
		return
	}
	// interruptors is written as [] because that is what T3's own client sends.
	msg := t3rpc.NewInterruptClientMessage(t3rpc.Interrupt{
		RequestId:    t3rpc.NewStringRequestId(cl.id),
		Interruptors: []jx.Raw{},
	})
	if err := c.send(msg); err != nil {
		c.log.Debug("effectrpc: Interrupt not sent", "method", cl.method, "id", cl.id, "err", err)
	}
}

func (c *Conn) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *Conn) isPending(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	return ok
}

// lookup returns the request for id; take also removes it (its Exit arrived).
func (c *Conn) lookup(id string, take bool) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.pending[id]
	if take {
		delete(c.pending, id)
	}
	return cl
}

// send writes one client message.
func (c *Conn) send(m t3rpc.ClientMessage) error {
	return c.sendFrame(encodeClient(m))
}

// sendFrame writes one encoded client message; the library copies it (masking it), so frame may be
// sent again. A write that takes writeTimeout closes the connection (writeOverdue), as does a
// closing connection (the socket is closed under it).
func (c *Conn) sendFrame(frame []byte) error {
	if c.tap != nil {
		c.tap("send", frame)
	}
	c.wmu.Lock()
	c.writeStart.Store(time.Now().UnixNano())
	c.writeWatch.Reset(c.writeTimeout)
	// A context without Done: the library then arms nothing of its own per write.
	err := c.ws.Write(context.Background(), websocket.MessageText, frame)
	c.writeStart.Store(0)
	c.writeWatch.Stop()
	c.wmu.Unlock()
	if err != nil {
		// The library closes the socket on a failed or timed-out write, so every
		// waiter must hear about it, not just this sender.
		c.fail(fmt.Errorf("%w: write failed: %v", ErrClosed, err))
		return c.Err()
	}
	return nil
}

// writeOverdue runs when writeWatch fires: a write that has taken writeTimeout means the peer
// stopped reading, and the connection is closed (which ends the write); one that began later than
// that (the timer fired for a write just done) is watched for the rest of its time.
func (c *Conn) writeOverdue() {
	start := c.writeStart.Load()
	if start == 0 {
		return
	}
	if left := c.writeTimeout - time.Since(time.Unix(0, start)); left > 0 {
		c.writeWatch.Reset(left)
		return
	}
	c.fail(fmt.Errorf("%w: a write took longer than %v: T3 stopped reading", ErrClosed, c.writeTimeout))
}

// shutdown marks the connection closed with cause; it reports whether this
// call was the first. Waiters observe done and return Err().
func (c *Conn) shutdown(cause error) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.err = cause
	close(c.done)
	c.mu.Unlock()
	if cause != ErrClosed {
		c.log.Debug("effectrpc: connection closed", "err", cause)
	}
	return true
}

// fail closes the connection because of a fault (lost socket, no Pong, Defect).
func (c *Conn) fail(cause error) {
	if c.shutdown(cause) {
		_ = c.ws.CloseNow()
	}
}

func (c *Conn) readLoop(limit int64) {
	defer c.wg.Done()
	var fd frameDecoder
	for {
		fr, err := c.readFrame()
		if err != nil {
			c.fail(fmt.Errorf("%w: %s", ErrClosed, describeReadErr(err, limit)))
			c.acks = nil
			return
		}
		read := time.Now()
		data := fr.buf.Bytes()
		if c.tap != nil {
			c.tap("recv", data)
		}
		msgs, err := fd.decode(data)
		if err != nil {
			c.log.Warn("effectrpc: undecodable frame from T3", "err", err, "bytes", len(data))
		}
		// Decoding copied what the messages hold but a Chunk's values (decodeChunk): a stream
		// that borrows them holds the frame until its handler is done; the loop's own hold ends
		// here, and the buffer serves a later frame once nobody holds it.
		for _, m := range msgs {
			c.handle(m, read, fr)
		}
		fd.done()
		fr.release()
		// The Acks owed go out now unless the next frame is already here whole: reading it
		// cannot wait for them, and its Acks then go out with them (peekConn). Bounded, so that
		// a long burst does not hold the first Ack back for all of it.
		if len(c.acks) > 0 && (len(c.acks) >= maxAcksHeld || c.peek == nil || !c.peek.ready.Load()) {
			c.flushAcks()
		}
	}
}

// maxAcksHeld bounds the Acks the read loop holds while it reads frames already buffered.
const maxAcksHeld = 32

// ackOnRead owes T3 the Ack of cl's last Chunk, from the read loop: it goes out with the others
// the loop owes (flushAcks). An Ack only waits there, never goes out before it would have.
func (c *Conn) ackOnRead(cl *call) {
	c.acks = append(c.acks, cl.ackFrame)
}

// flushAcks writes the Acks the read loop owes in one frame: alone as it is, several as one JSON
// array of messages. T3's server takes an array frame as its messages in order: effect-smol's
// packages/effect/src/unstable/rpc/RpcSerialization.ts, json.decode, returns
// `Array.isArray(parsed) ? parsed : [parsed]`, and RpcServer.ts's makeSocketProtocol hands each
// decoded message on in turn (T3 runs effect 4.0.0-beta.73; Effect 3's json parser did not split
// arrays). A failed write closes the connection (sendFrame); the streams hear of it.
func (c *Conn) flushAcks() {
	frame := c.acks[0]
	if len(c.acks) > 1 {
		b := append(c.ackBuf[:0], '[')
		for i, a := range c.acks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, a...)
		}
		b = append(b, ']')
		c.ackBuf, frame = b, b
	}
	clear(c.acks)
	c.acks = c.acks[:0]
	_ = c.sendFrame(frame)
}

// readFrame reads the next frame into a pooled buffer, held once (by the read loop). A frame
// read into a fresh slice (websocket.Conn.Read's io.ReadAll) grows it from 512 bytes,
// allocating and copying several times its size: under load T3 sends chunks of hundreds of
// kilobytes, and that was the largest cost of the read loop.
func (c *Conn) readFrame() (*frame, error) {
	// A context without Done, as for writes: with one, the library arms a context.AfterFunc for
	// every read it makes (the frame's header, then its payload), allocating each time and
	// taking the context's lock twice; that was 2 % of the connector's CPU in the latency phase
	// (docs/benchmarks.md). What it watched for is done here: everything that ends the
	// connection (fail, Close) closes the socket, which ends a read in progress.
	_, r, err := c.ws.Reader(context.Background())
	if err != nil {
		return nil, err
	}
	fr := frames.Get().(*frame)
	fr.buf.Reset()
	fr.holds.Store(1)
	// Room for a frame as large as this connection's last one, in one step: a buffer new to the
	// pool (the pool is emptied by garbage collections, and a stream's handler holds its frame
	// while the next is read) otherwise grows by doubling from 512 bytes, zeroing and copying at
	// each step. MinRead: ReadFrom wants that much room left to see the end of the frame.
	fr.buf.Grow(c.lastFrame + bytes.MinRead)
	if _, err := fr.buf.ReadFrom(r); err != nil {
		fr.release()
		return nil, err
	}
	c.lastFrame = min(fr.buf.Len(), maxFrameHint)
	return fr, nil
}

// frame is one read frame's buffer and how many hold it: the read loop while it decodes and
// dispatches the frame, and each borrowing stream's handler (StreamChunks) until it is done with
// the chunk's values. The last to let go returns it to frames. A hold never released (a stream
// abandoned with chunks still queued) only keeps the buffer from the pool: the collector takes it.
type frame struct {
	buf   bytes.Buffer
	holds atomic.Int32
}

// hold adds a holder; release drops one. Both take a nil frame (values that were copied).
func (f *frame) hold() {
	f.holds.Add(1)
}

func (f *frame) release() {
	if f == nil || f.holds.Add(-1) != 0 {
		return
	}
	// One snapshot of many megabytes is not worth holding on to.
	if f.buf.Cap() <= maxPooledFrame {
		frames.Put(f)
	}
}

// frames holds frame buffers between reads, shared by all connections (the pool lets the GC
// drop idle ones).
var frames = sync.Pool{New: func() any { return new(frame) }}

// maxPooledFrame bounds the buffers kept.
const maxPooledFrame = 4 << 20

// maxFrameHint bounds readFrame's room made ahead: a busy stream's chunks (up to a few hundred
// kilobytes), not a start-up snapshot's megabytes, which would otherwise be allocated once more
// for the frame read after it, while the snapshot is still being applied.
const maxFrameHint = 512 << 10

func describeReadErr(err error, limit int64) string {
	if errors.Is(err, websocket.ErrMessageTooBig) {
		return fmt.Sprintf("T3 sent a frame larger than the read limit of %d bytes", limit)
	}
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		if ce.Reason != "" {
			return fmt.Sprintf("T3 closed the socket (%d %s)", int(ce.Code), ce.Reason)
		}
		return fmt.Sprintf("T3 closed the socket (%d)", int(ce.Code))
	}
	return "socket lost: " + err.Error()
}

// handle dispatches one message of fr.
func (c *Conn) handle(m inbound, read time.Time, fr *frame) {
	if ch := m.chunk; ch != nil {
		cl := c.lookup(ch.id, false)
		if cl == nil {
			c.log.Debug("effectrpc: Chunk for an unknown request", "id", ch.id)
			return
		}
		ev := event{values: ch.values, frame: fr, read: read}
		if cl.inline != nil {
			c.inlineChunk(cl, ev)
			return
		}
		if cl.borrow {
			fr.hold()
		} else {
			ev.values, ev.frame = copyValues(ch.values), nil
		}
		c.pushChunk(cl, ev)
		return
	}
	if m.err != nil {
		if m.requestID == "" {
			c.log.Warn("effectrpc: undecodable message from T3", "tag", m.tag, "err", m.err)
			return
		}
		// A reply that cannot be read still ends its request, or it would wait forever.
		if cl := c.lookup(m.requestID, true); cl != nil {
			cl.push(event{end: true, err: &Error{
				Kind: KindProtocol, Method: cl.method,
				Message: fmt.Sprintf("undecodable %q message from T3: %v", m.tag, m.err),
			}})
		}
		return
	}
	switch m.msg.Type {
	case t3rpc.ChunkServerMessage:
		id := idKey(m.msg.Chunk.RequestId)
		cl := c.lookup(id, false)
		if cl == nil {
			// Late chunk of an interrupted stream.
			c.log.Debug("effectrpc: Chunk for an unknown request", "id", id)
			return
		}
		if cl.inline != nil {
			c.inlineChunk(cl, event{values: m.msg.Chunk.Values, read: read})
			return
		}
		c.pushChunk(cl, event{values: m.msg.Chunk.Values, read: read})
	case t3rpc.ExitServerMessage:
		id := idKey(m.msg.Exit.RequestId)
		cl := c.lookup(id, true)
		if cl == nil {
			c.log.Debug("effectrpc: Exit for an unknown request", "id", id)
			return
		}
		ex := m.msg.Exit.Exit
		if f, ok := ex.GetExitFailure(); ok {
			cl.push(event{end: true, err: exitError(cl.method, f)})
			return
		}
		cl.push(event{end: true, value: ex.ExitSuccess.Value})
	case t3rpc.PongServerMessage:
		c.awaitingPong.Store(false)
	case t3rpc.DefectServerMessage:
		d := &Error{Kind: KindDefect, Message: defectMessage(m.msg.Defect.Defect)}
		c.fail(fmt.Errorf("%w: %w", ErrClosed, d))
	case t3rpc.ClientProtocolErrorServerMessage:
		// Effect's client fails every in-flight request on this and keeps the socket.
		msg := defectMessage(m.msg.ClientProtocolError.Error)
		c.mu.Lock()
		calls := c.pending
		c.pending = make(map[string]*call)
		c.mu.Unlock()
		c.log.Warn("effectrpc: ClientProtocolError from T3", "message", msg, "failed", len(calls))
		for _, cl := range calls {
			cl.push(event{end: true, err: &Error{Kind: KindProtocol, Method: cl.method, Message: msg}})
		}
	}
}

// pushChunk queues a Chunk for its stream; an ahead stream's Ack goes out from here, on the read
// loop, when there is room (StreamAhead).
func (c *Conn) pushChunk(cl *call, ev event) {
	if cl.onRead != nil {
		if taken, failed := cl.takeOnRead(ev.values); taken {
			ev.frame.release()
			if !failed {
				c.ackOnRead(cl)
			}
			return
		}
	}
	if cl.pushChunk(ev) {
		c.ackOnRead(cl)
	}
}

// inlineChunk runs an inline stream's handler on a Chunk (StreamInline), here on the read loop,
// and acknowledges it when that was all; otherwise the Chunk goes to the stream's goroutine: its
// rest, or the whole handler when an earlier Chunk is still to be done there. ev.frame, when set,
// holds ev.values: held for the goroutine.
func (c *Conn) inlineChunk(cl *call, ev event) {
	if !cl.isBehind() {
		rest := cl.inline(Chunk{Values: ev.values, Read: ev.read})
		if rest == nil {
			if c.isPending(cl.id) {
				// A failed Ack means the socket is gone; the stream's goroutine hears of it.
				c.ackOnRead(cl)
			}
			return
		}
		ev.rest = rest
	} else {
		ev.whole = true
	}
	if ev.frame != nil {
		ev.frame.hold()
	}
	cl.pushBehind(ev)
}

// pingLoop sends a Ping every interval while none is unanswered, and closes
// the socket when a Ping's Pong has not come within pongTimeout.
func (c *Conn) pingLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.pingInterval)
	defer t.Stop()
	deadline := time.NewTimer(c.pongTimeout)
	deadline.Stop()
	defer deadline.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-deadline.C:
			if c.awaitingPong.Load() {
				c.fail(fmt.Errorf("%w: no Pong from T3 within %v of a Ping; the socket is dead", ErrClosed, c.pongTimeout))
				return
			}
		case <-t.C:
			if c.awaitingPong.Load() {
				continue // late, but its Ping still has time (pongTimeout)
			}
			c.awaitingPong.Store(true)
			deadline.Reset(c.pongTimeout)
			// A failed write closes the connection itself; nothing else to do here.
			_ = c.send(t3rpc.NewPingClientMessage(t3rpc.Ping{}))
		}
	}
}
