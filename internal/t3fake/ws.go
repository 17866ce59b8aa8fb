package t3fake

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Effect RPC over one WebSocket. The reader goroutine (the HTTP handler's) decodes frames and
// answers calls; the writer goroutine writes what it is woken for, except the Chunk an Ack lets
// go, which the reader writes itself (writeAcked). Whoever writes holds conn.wmu from taking
// messages off the queues (collect) to the end of their write, so message order on the socket is
// the order things were queued. Streams follow T3's Ack flow control: a subscription with a Chunk in flight
// sends nothing until that Chunk's Ack; what arrives meanwhile waits in its queue and goes out
// batched in the next Chunk.

// queued is one encoded stream item waiting for its Chunk.
type queued struct {
	raw   jx.Raw
	kind  string // for OnItemSent
	seq   int64
	alone bool // a snapshot travels in a Chunk of its own
}

// sub is one stream (subscribeShell or subscribeThread) on one connection.
type sub struct {
	c        *conn
	id       t3rpc.RequestId
	key      string
	shell    bool
	threadID string
	// Guarded by c.mu.
	queue    []queued
	inflight bool // a Chunk is out and its Ack has not come back
	closed   bool
}

// push queues an item for the subscriber. Callers hold Server.mu, which orders all pushes.
func (sb *sub) push(q queued) {
	c := sb.c
	c.mu.Lock()
	if sb.closed {
		c.mu.Unlock()
		return
	}
	sb.queue = append(sb.queue, q)
	ready := !sb.inflight
	c.mu.Unlock()
	if ready {
		c.signal()
	}
}

// firstSlabSeq is the sequence of the oldest queued item whose bytes are a slab's (not a
// snapshot, not the completion marker), 0 if none.
func (sb *sub) firstSlabSeq() int64 {
	sb.c.mu.Lock()
	defer sb.c.mu.Unlock()
	for _, q := range sb.queue {
		if q.seq > 0 && !q.alone {
			return q.seq
		}
	}
	return 0
}

type conn struct {
	s      *Server
	ws     *websocket.Conn
	scopes []string
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1: "something may be ready to write"

	// wmu is held from collect to the end of the write of what it took, by whichever goroutine
	// writes (writeLoop, writeAcked): frames leave in the order they were collected.
	wmu    sync.Mutex
	frames []byte // Chunk frames being assembled and written (collect); reused, under wmu

	// The reader goroutine's own: its frame buffer, reused (nothing decoded from a frame keeps
	// its bytes: jx copies strings and raw payloads out), and whether an Ack in the frame it is
	// handling let a Chunk go (it writes that Chunk once the frame is handled).
	rbuf     bytes.Buffer
	ackReady bool
	// frameAcked: the frame being handled carried an Ack (Stats.AckFrames).
	frameAcked bool

	mu    sync.Mutex
	ctrl  []jx.Raw // encoded Exit/Pong/Defect messages, in order
	subs  map[string]*sub
	order []*sub // subscriptions in creation order, for a stable write order
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// drop closes the socket at once, without a close handshake, as a lost network would.
func (c *conn) drop() {
	c.cancel()
	_ = c.ws.CloseNow()
}

// Pre-encoded constant messages.
var (
	pongRaw        = encode(t3rpc.NewPongServerMessage(t3rpc.Pong{Tag: "Pong"}))
	shellSyncRaw   = encode(&t3rpc.ShellStreamItem{Kind: "synchronized"})
	threadSyncRaw  = encode(&t3rpc.ThreadStreamItem{Kind: "synchronized"})
	emptyObjectRaw = jx.Raw("{}")
)

// serveConn runs one accepted socket until it closes.
func (s *Server) serveConn(ws *websocket.Conn, scopes []string) {
	ws.SetReadLimit(4 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{s: s, ws: ws, scopes: scopes, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), subs: map[string]*sub{}}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.drop()
		return
	}
	s.conns[c] = struct{}{}
	// Close waits for both goroutines: the handler's is hijacked, so the HTTP server no longer
	// tracks it. Added under mu after the closed check, so never after Close began waiting.
	s.wg.Add(2)
	s.mu.Unlock()
	defer s.wg.Done()
	s.wsConnections.Add(1)
	s.wsOpen.Add(1)
	defer s.wsOpen.Add(-1)

	writerDone := make(chan struct{})
	go func() {
		defer s.wg.Done()
		defer close(writerDone)
		c.writeLoop()
	}()
	c.readLoop()
	// Reads and writes take no context (a cancellable one costs an AfterFunc per call): closing
	// the socket is what ends a write still blocked on it.
	c.drop()
	<-writerDone

	s.mu.Lock()
	delete(s.conns, c)
	c.mu.Lock()
	for _, sb := range c.order {
		sb.closed = true
		s.removeSub(sb)
	}
	c.subs, c.order = nil, nil
	c.mu.Unlock()
	s.mu.Unlock()
	_ = ws.CloseNow()
}

func (s *Server) removeSub(sb *sub) {
	if sb.shell {
		delete(s.shellSubs, sb)
		return
	}
	if m := s.threadSubs[sb.threadID]; m != nil {
		delete(m, sb)
		if len(m) == 0 {
			delete(s.threadSubs, sb.threadID)
		}
	}
}

// readLoop reads and handles frames until the socket fails or closes. It reads into one
// buffer it keeps (websocket.Conn.Read allocates each message anew) and passes no context: the
// socket's close ends a blocked read (drop, Server.Close).
func (c *conn) readLoop() {
	for {
		_, r, err := c.ws.Reader(context.Background())
		if err != nil {
			return
		}
		c.rbuf.Reset()
		if _, err := c.rbuf.ReadFrom(r); err != nil {
			return
		}
		c.handleFrame(c.rbuf.Bytes())
		if c.rbuf.Cap() > maxReadBuffer {
			c.rbuf = bytes.Buffer{} // one large request: not kept
		}
		if c.ackReady {
			c.ackReady = false
			if err := c.writeAcked(); err != nil {
				return
			}
		}
	}
}

// writeAcked writes, on the reader's goroutine, what the Acks of the frame just read let go:
// the writer goroutine is not woken for it, a goroutine wake-up less per such Chunk (most of a
// loaded latency phase's Chunks: the rows a step queued while the Chunk before was out), and
// the Chunk does not wait for a second goroutine to get a core. It is left to the writer
// goroutine when that one is writing (it collects again before it sleeps) or when it is more
// than maxAckedWrite bytes, so that the reader does not sit in a long write while the peer's
// frames wait.
func (c *conn) writeAcked() error {
	if !c.wmu.TryLock() {
		c.s.ackedToWriter.Add(1)
		c.signal()
		return nil
	}
	defer c.wmu.Unlock()
	out, chunks, over := c.collect(maxAckedWrite)
	if over {
		c.s.ackedToWriter.Add(1)
		c.signal()
		return nil
	}
	if len(out) == 0 {
		return nil
	}
	began := time.Now()
	if err := c.write(out); err != nil {
		return err
	}
	c.report(chunks, began)
	return nil
}

// maxAckedWrite bounds the items the reader writes itself after an Ack (writeAcked).
const maxAckedWrite = 32 << 10

// maxReadBuffer bounds the frame buffer a connection's reader keeps between frames.
const maxReadBuffer = 64 << 10

// handleFrame accepts one message or an array of messages per frame, as Effect's JSON
// serialization does.
func (c *conn) handleFrame(data []byte) {
	defer func() {
		if c.frameAcked {
			c.frameAcked = false
			c.s.ackFrames.Add(1)
		}
	}()
	d := jx.DecodeBytes(data)
	switch d.Next() {
	case jx.Object:
		c.handleMessage(data)
	case jx.Array:
		if err := d.Arr(func(d *jx.Decoder) error {
			raw, err := d.Raw()
			if err != nil {
				return err
			}
			c.handleMessage(raw)
			return nil
		}); err != nil {
			c.defect("Invalid message: " + err.Error())
		}
	default:
		c.defect("Invalid message: expected an object or an array")
	}
}

func (c *conn) handleMessage(raw []byte) {
	if id, ok := plainAckID(raw); ok {
		// The connector's Ack, one per Chunk: settled without the message decoder.
		c.s.acks.Add(1)
		c.frameAcked = true
		if c.ackKey(id) {
			c.ackReady = true
		}
		return
	}
	var m t3rpc.ClientMessage
	if err := m.Decode(jx.DecodeBytes(raw)); err != nil {
		// Effect answers an undecodable message (bad id, unknown _tag) with a connection defect.
		c.defect("Invalid message: " + err.Error())
		return
	}
	switch m.Type {
	case t3rpc.RequestClientMessage:
		c.s.requests.Add(1)
		c.handleRequest(m.Request)
	case t3rpc.AckClientMessage:
		c.s.acks.Add(1)
		c.frameAcked = true
		if c.ack(m.Ack.RequestId) {
			c.ackReady = true
		}
	case t3rpc.InterruptClientMessage:
		c.interrupt(m.Interrupt.RequestId)
	case t3rpc.PingClientMessage:
		if !c.s.stopPongs.Load() {
			c.send(pongRaw)
		}
	case t3rpc.EOFClientMessage:
		// "No more requests": nothing to do, the open streams go on.
	}
}

func (c *conn) handleRequest(req t3rpc.Request) {
	s := c.s
	payload := req.Payload
	if len(payload) == 0 {
		payload = emptyObjectRaw
	}
	switch req.Method {
	case "server.getConfig", "server.probe", "orchestration.subscribeShell",
		"orchestration.subscribeThread", "orchestration.getThreadProjection":
		if !hasScope(c.scopes, ScopeRead) {
			c.exit(req.ID, failed(missingScope(ScopeRead)))
			return
		}
	}
	switch req.Method {
	case "server.getConfig":
		cfg := s.serverConfig()
		c.exit(req.ID, ok(&cfg))
	case "server.probe":
		c.exit(req.ID, result{value: emptyObjectRaw})
	case "orchestration.subscribeShell":
		c.subscribeShell(req.ID, payload)
	case "orchestration.subscribeThread":
		c.subscribeThread(req.ID, payload)
	case "orchestration.getThreadProjection":
		c.exit(req.ID, s.getThreadProjection(payload))
	case "orchestration.dispatchCommand":
		c.exit(req.ID, s.dispatchCommand(payload, c.scopes))
	case "orchestration.launchThread":
		c.exit(req.ID, s.launchThread(payload, c.scopes))
	default:
		if r, ok := s.readRPC(req.Method, payload, c.scopes); ok {
			c.exit(req.ID, r)
			return
		}
		c.exit(req.ID, died("Unknown request tag: "+req.Method))
	}
}

func (c *conn) send(raw jx.Raw) {
	c.mu.Lock()
	c.ctrl = append(c.ctrl, raw)
	c.mu.Unlock()
	c.signal()
}

func (c *conn) defect(msg string) {
	c.send(encode(t3rpc.NewDefectServerMessage(t3rpc.Defect{Tag: "Defect", Defect: jsonString(msg)})))
}

func (c *conn) exit(id t3rpc.RequestId, r result) {
	var ex t3rpc.ExitResult
	switch {
	case r.fail != nil:
		ex = t3rpc.NewExitFailureExitResult(t3rpc.ExitFailure{Tag: "Failure", Cause: []t3rpc.Cause{
			{Tag: "Fail", Error: t3rpc.NewOptTaggedError(*r.fail)},
		}})
	case r.die != "":
		ex = t3rpc.NewExitFailureExitResult(t3rpc.ExitFailure{Tag: "Failure", Cause: []t3rpc.Cause{
			{Tag: "Die", Defect: jsonString(r.die)},
		}})
	default:
		ex = t3rpc.NewExitSuccessExitResult(t3rpc.ExitSuccess{Tag: "Success", Value: r.value})
	}
	c.send(encode(t3rpc.NewExitServerMessage(t3rpc.Exit{Tag: "Exit", RequestId: id, Exit: ex})))
}

// addSub registers a stream with its first items. Callers hold Server.mu. A request id reused
// for a new stream replaces the old stream.
func (c *conn) addSub(sb *sub, first []queued) {
	c.mu.Lock()
	if old := c.subs[sb.key]; old != nil {
		old.closed = true
		c.s.removeSub(old)
		c.order = slices.DeleteFunc(c.order, func(x *sub) bool { return x == old })
	}
	sb.queue = first
	c.subs[sb.key] = sb
	c.order = append(c.order, sb)
	c.mu.Unlock()
	c.signal()
}

func (c *conn) subscribeShell(id t3rpc.RequestId, payload jx.Raw) {
	var in t3rpc.SubscribeShellInput
	if err := decodePayload(payload, &in); err != nil {
		c.exit(id, died(decodeDefect(err)))
		return
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var first []queued
	if after, set := in.AfterSequence.Get(); set && s.canReplay(after) {
		for _, e := range s.log[s.logFrom(after):] {
			if e.shell != nil {
				first = append(first, queued{raw: e.shell, kind: e.shellKind, seq: e.seq})
			}
		}
	} else {
		item := t3rpc.ShellStreamItem{Kind: "snapshot", Snapshot: t3rpc.NewOptShellSnapshot(s.shellSnapshot())}
		first = append(first, queued{raw: encode(&item), kind: "shell:snapshot", seq: s.head, alone: true})
	}
	if in.RequestCompletionMarker.Or(false) {
		first = append(first, queued{raw: shellSyncRaw, kind: "shell:synchronized"})
	}
	sb := &sub{c: c, id: id, key: requestKey(id), shell: true}
	c.addSub(sb, first)
	s.shellSubs[sb] = struct{}{}
}

func (c *conn) subscribeThread(id t3rpc.RequestId, payload jx.Raw) {
	var in t3rpc.SubscribeThreadInput
	if err := decodePayload(payload, &in); err != nil {
		c.exit(id, died(decodeDefect(err)))
		return
	}
	s := c.s
	s.mu.Lock()
	th := s.threadByID[in.ThreadId]
	if th == nil || s.failThreadSubs.Load() {
		s.mu.Unlock()
		c.exit(id, failed(projectionError(in.ThreadId)))
		return
	}
	defer s.mu.Unlock()
	var first []queued
	if after, set := in.AfterSequence.Get(); set && s.canReplay(after) {
		for i := s.logFrom(after); i < len(s.log); i++ {
			if e := &s.log[i]; e.evType != "" && e.threadID == th.id {
				first = append(first, queued{raw: e.threadItem(), kind: e.threadKind(), seq: e.seq})
			}
		}
	} else {
		// acceptBoundedSnapshot: T3's bounded answer, as /bounded (boundedSnapshotItem).
		var raw jx.Raw
		if in.AcceptBoundedSnapshot.Or(false) {
			raw = s.boundedSnapshotItem(th)
		} else {
			item := t3rpc.ThreadStreamItem{Kind: "snapshot", SnapshotSequence: optI64(s.head), Projection: t3rpc.NewOptThreadProjection(s.projection(th))}
			raw = encode(&item)
		}
		first = append(first, queued{raw: raw, kind: "thread:snapshot", seq: s.head, alone: true})
	}
	if in.RequestCompletionMarker.Or(false) {
		first = append(first, queued{raw: threadSyncRaw, kind: "thread:synchronized"})
	}
	sb := &sub{c: c, id: id, key: requestKey(id), threadID: th.id}
	c.addSub(sb, first)
	if s.threadSubs[th.id] == nil {
		s.threadSubs[th.id] = map[*sub]struct{}{}
	}
	s.threadSubs[th.id][sb] = struct{}{}
}

// openStreams counts the shell streams open now and those of them not settled (a Chunk
// awaiting its Ack, or items queued), and the thread streams open now, for Stats.
func (s *Server) openStreams() (shell, unsettled, thread int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.mu.Lock()
		for _, sb := range c.order {
			if !sb.shell {
				thread++
				continue
			}
			shell++
			if sb.inflight || len(sb.queue) > 0 {
				unsettled++
			}
		}
		c.mu.Unlock()
	}
	return shell, unsettled, thread
}

// ack settles the stream's Chunk in flight and reports whether items wait for the next one: the
// reader writes that Chunk once the frame is handled (writeAcked).
func (c *conn) ack(id t3rpc.RequestId) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ackedLocked(c.subs[requestKey(id)])
}

// ackKey is ack for a string request id given as its bytes (plainAckID): the stream is found
// by a key built on the stack, with no string made.
func (c *conn) ackKey(id []byte) bool {
	var kb [32]byte
	key := append(append(kb[:0], 's'), id...) // requestKey of a string id
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ackedLocked(c.subs[string(key)])
}

func (c *conn) ackedLocked(sb *sub) bool {
	if sb != nil && sb.inflight {
		sb.inflight = false
		return len(sb.queue) > 0
	}
	return false
}

// The connector's Ack, byte for byte as t3rpc encodes it with a string request id (effectrpc
// encodes each stream's once): {"_tag":"Ack","requestId":"<id>"}.
var (
	ackPrefix = []byte(`{"_tag":"Ack","requestId":"`)
	ackSuffix = []byte(`"}`)
)

// plainAckID reports whether raw is an Ack in exactly the connector's form, with a request id
// that is a JSON string of its own bytes (no escape, no control character, valid UTF-8), and
// returns that id. Anything else, an Ack with other spacing or key order included, goes through
// the message decoder, which gives the same answer for these (FuzzPlainAckID): at 1,000 runs/s
// the fakes read ~7,000 Acks a second, and the decoder's per-key work was most of an Ack's
// handling (docs/benchmarks.md, "Acks without the message decoder").
func plainAckID(raw []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(raw, ackPrefix)
	if !ok {
		return nil, false
	}
	id, ok := bytes.CutSuffix(rest, ackSuffix)
	if !ok {
		return nil, false
	}
	for _, b := range id {
		if b == '"' || b == '\\' || b < 0x20 {
			return nil, false
		}
	}
	if !utf8.Valid(id) {
		return nil, false
	}
	return id, true
}

// interrupt ends a stream with Exit Failure [Interrupt], as T3 does when the client unsubscribes.
// Calls finish before the next frame is read, so only streams can be interrupted; other ids are
// ignored.
func (c *conn) interrupt(id t3rpc.RequestId) {
	s := c.s
	s.mu.Lock()
	c.mu.Lock()
	sb := c.subs[requestKey(id)]
	if sb == nil {
		c.mu.Unlock()
		s.mu.Unlock()
		return
	}
	delete(c.subs, sb.key)
	c.order = slices.DeleteFunc(c.order, func(x *sub) bool { return x == sb })
	sb.closed, sb.queue = true, nil
	c.mu.Unlock()
	s.removeSub(sb)
	s.fiberID++
	fiber := s.fiberID
	s.mu.Unlock()
	ex := t3rpc.NewExitFailureExitResult(t3rpc.ExitFailure{Tag: "Failure", Cause: []t3rpc.Cause{
		{Tag: "Interrupt", FiberId: jx.Raw(strconv.FormatInt(fiber, 10))},
	}})
	c.send(encode(t3rpc.NewExitServerMessage(t3rpc.Exit{Tag: "Exit", RequestId: id, Exit: ex})))
}

type chunkOut struct {
	id    t3rpc.RequestId
	items []queued
}

// collect takes what may be written now: every control message, and one Chunk for each stream
// with items and no Chunk in flight (none while StallStreams is on). With limit > 0 it takes
// nothing and reports over when the Chunks' items would be more than limit bytes. The caller
// holds wmu.
func (c *conn) collect(limit int) (out []jx.Raw, chunks []chunkOut, over bool) {
	c.mu.Lock()
	stall := c.s.stall.Load()
	stallThreads, stallShell := c.s.stallThreads.Load(), c.s.stallShell.Load()
	// chunkLen is how many of sb's queued items its next Chunk takes, 0 if none may go now.
	chunkLen := func(sb *sub) int {
		if stall || sb.inflight || len(sb.queue) == 0 || (stallThreads && !sb.shell) || (stallShell && sb.shell) {
			return 0
		}
		for i, q := range sb.queue {
			if q.alone {
				return max(i, 1) // a snapshot ends the Chunk before it, or is the Chunk
			}
		}
		return len(sb.queue)
	}
	if limit > 0 {
		size := 0
		for _, sb := range c.order {
			for _, q := range sb.queue[:chunkLen(sb)] {
				size += len(q.raw)
			}
		}
		if size > limit {
			c.mu.Unlock()
			return nil, nil, true
		}
	}
	out = c.ctrl
	c.ctrl = nil
	if !stall {
		for _, sb := range c.order {
			n := chunkLen(sb)
			if n == 0 {
				continue
			}
			items := append([]queued(nil), sb.queue[:n]...)
			sb.queue = append(sb.queue[:0], sb.queue[n:]...)
			sb.inflight = true
			chunks = append(chunks, chunkOut{id: sb.id, items: items})
		}
	}
	// The frames are assembled in one buffer that the writer reuses: it is written (copied to
	// the socket) before the next collect. They are assembled before c.mu is let go: once an
	// item has left its queue, the slab may give its bytes to another item (slabReusable).
	buf := c.frames[:0]
	for _, ch := range chunks {
		start := len(buf)
		buf = appendChunkFrame(buf, ch.id, ch.items)
		out = append(out, jx.Raw(buf[start:len(buf):len(buf)]))
	}
	c.mu.Unlock()
	if cap(buf) <= maxFrameBuffer {
		c.frames = buf[:0]
	} else {
		c.frames = nil // a lagging subscriber's one big Chunk: not kept
	}
	return out, chunks, false
}

// maxFrameBuffer bounds the Chunk buffer a connection keeps between writes.
const maxFrameBuffer = 4 << 20

// chunkFrame is the Chunk message for items, byte for byte what encoding t3rpc.ServerMessage
// gives ({"_tag":"Chunk","requestId":…,"values":[…]}), in a buffer of its own.
func chunkFrame(id t3rpc.RequestId, items []queued) jx.Raw {
	return appendChunkFrame(nil, id, items)
}

// appendChunkFrame appends the Chunk message for items to buf: the items are already encoded,
// so the frame is assembled by copying, grown once to the right size.
func appendChunkFrame(buf []byte, id t3rpc.RequestId, items []queued) []byte {
	n := 64
	for _, q := range items {
		n += len(q.raw) + 1
	}
	var e jx.Encoder
	e.SetBytes(slices.Grow(buf, n))
	e.ObjStart()
	e.FieldStart("_tag")
	e.Str("Chunk")
	e.FieldStart("requestId")
	id.Encode(&e)
	e.FieldStart("values")
	e.ArrStart()
	buf = e.Bytes()
	first := true
	for _, q := range items {
		if len(q.raw) == 0 {
			continue
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = append(buf, q.raw...)
	}
	return append(buf, ']', '}')
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		}
		for {
			c.wmu.Lock()
			out, chunks, _ := c.collect(0)
			if len(out) == 0 {
				c.wmu.Unlock()
				break
			}
			began := time.Now()
			err := c.write(out)
			if err == nil {
				c.report(chunks, began)
			}
			c.wmu.Unlock()
			if err != nil {
				c.drop()
				return
			}
		}
	}
}

func (c *conn) write(out []jx.Raw) error {
	if c.s.opts.BatchFrames && len(out) > 1 {
		n := 1
		for _, m := range out {
			n += len(m) + 1
		}
		buf := make([]byte, 0, n)
		buf = append(buf, '[')
		for i, m := range out {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, m...)
		}
		buf = append(buf, ']')
		return c.ws.Write(context.Background(), websocket.MessageText, buf)
	}
	// No context: a cancellable one costs an AfterFunc per write; drop closes the socket, which
	// ends a blocked write.
	for _, m := range out {
		if err := c.ws.Write(context.Background(), websocket.MessageText, m); err != nil {
			return err
		}
	}
	return nil
}

// report counts the chunks just written and hands their items to the OnItemSent hook with the
// time their write began. Not the time it returned: the peer can read, act and answer before the
// writing goroutine gets a core again (a loaded CI machine showed a wake answered 0.3 ms "before"
// its frame was sent), while nothing can answer a frame before its write began. A latency from
// this time is an upper bound, by the write's own duration and the wait for a core after it
// (measured on the harness's machine: 7 µs at the median, 0.4 ms at the 99th percentile;
// docs/benchmarks.md, "When a frame was sent").
func (c *conn) report(chunks []chunkOut, began time.Time) {
	if len(chunks) == 0 {
		return
	}
	n := 0
	for _, ch := range chunks {
		n += len(ch.items)
	}
	c.s.chunks.Add(int64(len(chunks)))
	c.s.items.Add(int64(n))
	if fn := c.s.onItemSent.Load(); fn != nil {
		for _, ch := range chunks {
			for _, q := range ch.items {
				(*fn)(q.kind, q.seq, began)
			}
		}
	}
}
