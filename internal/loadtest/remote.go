package loadtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file: the split harness (Config.Split). The webhook receiver and the MCP clients (the
// agents calling t3_wait, t3_thread, t3_watch) run in a process of their own, as they would in a
// deployment (other services, not the process serving 100 T3s), so that their waits for a core
// of the harness process are not inside the event and wake latencies measured.
//
// The parent (Run) starts the child with Config.Split (t3code-load re-executes itself with the
// hidden subcommand `harness-clients`, which calls ServeClients) and talks to it over the
// child's stdin and stdout, one tab-separated line a message:
//
//	child → parent   R url                 the receiver listens (T3CODE_MCP_HOOK_URL)
//	                 A err                 the agents connected (err empty) or not
//	                 E at rx bad id type thread run   a delivery taken, at its arrival (and its
//	                                       bytes' receive stamp, 0: none)
//	                 X / C                 a delivery refused (down) / a connection accepted
//	                 W id t0 t1 rx err raw a tool call's answer: started, answered, its bytes' receive
//	                                       stamp (0: none; rxstamp.go), error, result
//	parent → child   A base n conns        connect n MCP sessions to the connector
//	                 K id session tool args  call a tool
//	                 Z id                  cancel a call
//	                 D 0|1                 the receiver up or down (the outage phase)
//	                 Q                     close the MCP sessions (the receiver stays)
//	                 end of input          stop
//
// The parent's receiver is a mirror fed by the E, X and C lines: its bookkeeping (first
// delivery per run, each thread's order, duplicates, bad ones) is the same code as in one
// process. Times cross the pipe as wall-clock readings (time.Now().UnixNano(), CLOCK_REALTIME):
// both processes read the same kernel clock, so a frame's send time taken in the parent and a
// webhook's or a wake's arrival taken in the child are on one scale. The only thing that could
// skew them is the clock being stepped during a run (NTP steps; a slew moves it by at most 0.05 %,
// 5 µs per 10 ms), which a run on a host that keeps its clock does not see.

// agentPool is the MCP clients: in this process (agents) or in the split child (remoteAgents).
type agentPool interface {
	// call runs a tool on session i and returns its structured content as JSON.
	call(ctx context.Context, i int, tool string, args map[string]any) (json.RawMessage, error)
	// timedCall is call with when the call began and when its answer was received, taken where
	// the client runs.
	timedCall(ctx context.Context, i int, tool string, args map[string]any) (json.RawMessage, callTimes, error)
	close()
}

// callTimes are a tool call's times, taken where its client runs.
type callTimes struct {
	start time.Time // the call began
	end   time.Time // its answer was read and decoded
	rx    time.Time // its answer's last bytes reached the client's socket (the kernel's stamp); zero: none
}

func (a *agents) timedCall(ctx context.Context, i int, tool string, args map[string]any) (json.RawMessage, callTimes, error) {
	ctx, m := withRxMark(ctx)
	start := time.Now()
	raw, err := a.call(ctx, i, tool, args)
	end := time.Now()
	return raw, callTimes{start: start, end: end, rx: m.time()}, err
}

// ---- the child ----

// ServeClients is the split harness's child: it runs the webhook receiver and, once asked, the
// MCP clients, reading the parent's requests from in and writing the receiver's deliveries and
// the calls' answers to out, until in ends.
func ServeClients(in io.Reader, out io.Writer) error {
	w := newLineWriter(out)
	defer w.close()
	rec, err := newForwardingReceiver(w)
	if err != nil {
		return err
	}
	defer rec.close()
	w.send("R\t" + rec.url)

	var (
		ag      *agents
		mu      sync.Mutex
		cancels = map[string]context.CancelFunc{}
		calls   sync.WaitGroup
	)
	closeAgents := func() {
		mu.Lock()
		for _, c := range cancels {
			c()
		}
		mu.Unlock()
		calls.Wait()
		if ag != nil {
			ag.close()
			ag = nil // closed once (Q, then the end of input); a call after Q finds no sessions
		}
	}
	defer closeAgents()
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), "\t", 5)
		switch {
		case f[0] == "A" && len(f) == 4 && ag == nil:
			n, _ := strconv.Atoi(f[2])
			conns, _ := strconv.Atoi(f[3])
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			ag, err = newAgents(ctx, f[1], n, conns)
			cancel()
			msg := ""
			if err != nil {
				msg = strconv.Quote(err.Error())
			}
			w.send("A\t" + msg)
		case f[0] == "K" && len(f) == 5:
			if ag == nil {
				w.send(answerLine(f[1], callTimes{start: time.Now(), end: time.Now()}, nil, errors.New("no MCP sessions")))
				continue
			}
			id, tool := f[1], f[3]
			session, _ := strconv.Atoi(f[2])
			var args map[string]any
			if err := json.Unmarshal([]byte(f[4]), &args); err != nil {
				w.send(answerLine(id, callTimes{start: time.Now(), end: time.Now()}, nil, err))
				continue
			}
			ctx, cancel := context.WithCancel(context.Background())
			mu.Lock()
			cancels[id] = cancel
			mu.Unlock()
			calls.Add(1)
			go func() {
				defer calls.Done()
				raw, times, err := ag.timedCall(ctx, session, tool, args)
				if tool == "t3_wait" && trace.IsEnabled() {
					trace.Log(ctx, "loadtest.t3_wait", fmt.Sprint(args["thread_id"]))
				}
				mu.Lock()
				delete(cancels, id)
				mu.Unlock()
				cancel()
				w.send(answerLine(id, times, raw, err))
			}()
		case f[0] == "Z" && len(f) == 2:
			mu.Lock()
			if c := cancels[f[1]]; c != nil {
				c()
			}
			mu.Unlock()
		case f[0] == "Q":
			closeAgents()
		case f[0] == "D" && len(f) == 2:
			rec.down.Store(f[1] == "1")
		default:
			return fmt.Errorf("harness clients: unexpected request %q", strings.TrimSpace(line))
		}
	}
}

func answerLine(id string, t callTimes, raw json.RawMessage, err error) string {
	msg := ""
	if err != nil {
		msg = strconv.Quote(err.Error())
	}
	return fmt.Sprintf("W\t%s\t%d\t%d\t%d\t%s\t%s", id, t.start.UnixNano(), t.end.UnixNano(), stampNanos(t.rx), msg, raw)
}

// lineWriter writes lines to the parent from any goroutine: queued, written by one goroutine,
// flushed whenever the queue is empty (a line waits for no timer; under load, lines share writes).
type lineWriter struct {
	q    chan string
	done chan struct{}
}

func newLineWriter(out io.Writer) *lineWriter {
	w := &lineWriter{q: make(chan string, 4096), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		bw := bufio.NewWriterSize(out, 64<<10)
		for l := range w.q {
			bw.WriteString(l)
			bw.WriteByte('\n')
			if len(w.q) == 0 {
				if bw.Flush() != nil {
					for range w.q { // the parent is gone: drop the rest
					}
					return
				}
			}
		}
		bw.Flush()
	}()
	return w
}

func (w *lineWriter) send(l string) { w.q <- l }

// delivery forwards one delivery the receiver took; bad as receiver.record decides it.
func (w *lineWriter) delivery(d delivery, bad bool) {
	b := "0"
	if bad {
		b = "1"
	}
	w.send(fmt.Sprintf("E\t%d\t%d\t%s\t%s\t%s\t%s\t%s", d.at.UnixNano(), stampNanos(d.rx), b, clean(d.id), clean(d.typ), clean(d.thread), clean(d.run)))
}

// clean keeps a field on its line: no tab or newline (ids never have one; a bad delivery might).
func clean(s string) string { return lineSafe.Replace(s) }

var lineSafe = strings.NewReplacer("\t", " ", "\n", " ")

func (w *lineWriter) close() {
	close(w.q)
	<-w.done
}

// ---- the parent ----

// clients is the parent's end of the split child.
type clients struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	inMu sync.Mutex
	rec  *receiver // the mirror

	nextID  atomic.Int64
	mu      sync.Mutex
	pending map[string]chan answer
	agentsC chan error
	readErr error
	done    chan struct{} // closed when the child's output ended
}

type answer struct {
	raw   json.RawMessage
	times callTimes
	err   error
}

// startClients starts the split child (argv) and waits for its receiver.
func startClients(argv []string) (*clients, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness clients %v: %w", argv, err)
	}
	c := &clients{cmd: cmd, in: in, pending: map[string]chan answer{}, agentsC: make(chan error, 1), done: make(chan struct{})}
	br := bufio.NewReaderSize(out, 64<<10)
	first, err := br.ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(first), "R\t")
	if err != nil || !ok {
		c.stop()
		return nil, fmt.Errorf("harness clients: no receiver (%q, %v)", first, err)
	}
	c.rec = &receiver{url: url, served: make(chan struct{})}
	close(c.rec.served)
	c.rec.reset(receiverHint)
	go c.read(br)
	return c, nil
}

func (c *clients) pid() int { return c.cmd.Process.Pid }

func (c *clients) send(l string) error {
	c.inMu.Lock()
	defer c.inMu.Unlock()
	_, err := io.WriteString(c.in, l+"\n")
	return err
}

// read takes the child's lines until its output ends.
func (c *clients) read(br *bufio.Reader) {
	defer close(c.done)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			c.mu.Lock()
			c.readErr = fmt.Errorf("harness clients: output ended: %w", err)
			for id, ch := range c.pending {
				ch <- answer{err: c.readErr}
				delete(c.pending, id)
			}
			c.mu.Unlock()
			return
		}
		line = line[:len(line)-1]
		switch line[0] {
		case 'E':
			f := strings.SplitN(string(line), "\t", 8)
			if len(f) != 8 {
				continue
			}
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			rx, _ := strconv.ParseInt(f[2], 10, 64)
			d := delivery{id: f[4], typ: f[5], thread: f[6], run: f[7], at: time.Unix(0, ns), rx: stampTime(rx)}
			var derr error
			if f[3] == "1" {
				derr = errBadDelivery
			}
			c.rec.record(d, derr, []byte(d.id))
		case 'X':
			c.rec.refused.Add(1)
		case 'C':
			c.rec.conns.Add(1)
		case 'A':
			c.agentsC <- unquoteErr(strings.TrimPrefix(string(line), "A\t"))
		case 'W':
			f := strings.SplitN(string(line), "\t", 7)
			if len(f) != 7 {
				continue
			}
			t0, _ := strconv.ParseInt(f[2], 10, 64)
			t1, _ := strconv.ParseInt(f[3], 10, 64)
			rx, _ := strconv.ParseInt(f[4], 10, 64)
			a := answer{times: callTimes{start: time.Unix(0, t0), end: time.Unix(0, t1), rx: stampTime(rx)}, err: unquoteErr(f[5])}
			if a.err == nil {
				a.raw = json.RawMessage(f[6])
			}
			c.mu.Lock()
			ch := c.pending[f[1]]
			delete(c.pending, f[1])
			c.mu.Unlock()
			if ch != nil {
				ch <- a
			}
		}
	}
}

var errBadDelivery = errors.New("bad delivery")

func unquoteErr(q string) error {
	if q == "" {
		return nil
	}
	s, err := strconv.Unquote(q)
	if err != nil {
		s = q
	}
	return errors.New(s)
}

// setDown turns the child's receiver down (503 to everything) or up again.
func (c *clients) setDown(down bool) error {
	c.rec.down.Store(down)
	v := "0"
	if down {
		v = "1"
	}
	return c.send("D\t" + v)
}

// agents connects n MCP sessions in the child to the connector at base.
func (c *clients) agents(ctx context.Context, base string, n, conns int) (agentPool, error) {
	if err := c.send(fmt.Sprintf("A\t%s\t%d\t%d", base, n, conns)); err != nil {
		return nil, err
	}
	select {
	case err := <-c.agentsC:
		if err != nil {
			return nil, err
		}
		return remoteAgents{c}, nil
	case <-c.done:
		return nil, c.readErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// stop ends the child: its input closed, it stops its clients and receiver and exits; killed
// after 15 s.
func (c *clients) stop() error {
	c.in.Close()
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-exited
		return errors.New("harness clients: did not exit within 15 s of their input closing; killed")
	}
}

// remoteAgents are the MCP clients in the split child.
type remoteAgents struct{ c *clients }

func (r remoteAgents) call(ctx context.Context, i int, tool string, args map[string]any) (json.RawMessage, error) {
	raw, _, err := r.timedCall(ctx, i, tool, args)
	return raw, err
}

func (r remoteAgents) timedCall(ctx context.Context, i int, tool string, args map[string]any) (json.RawMessage, callTimes, error) {
	b, err := json.Marshal(args)
	if err != nil {
		return nil, callTimes{}, err
	}
	id := strconv.FormatInt(r.c.nextID.Add(1), 10)
	ch := make(chan answer, 1)
	r.c.mu.Lock()
	if r.c.readErr != nil {
		r.c.mu.Unlock()
		return nil, callTimes{}, r.c.readErr
	}
	r.c.pending[id] = ch
	r.c.mu.Unlock()
	if err := r.c.send(fmt.Sprintf("K\t%s\t%d\t%s\t%s", id, i, tool, b)); err != nil {
		return nil, callTimes{}, err
	}
	select {
	case a := <-ch:
		return a.raw, a.times, a.err
	case <-ctx.Done():
		_ = r.c.send("Z\t" + id)
		a := <-ch // the child answers a cancelled call at once
		if a.err == nil {
			a.err = ctx.Err()
		}
		return a.raw, a.times, a.err
	}
}

// close closes the child's MCP sessions; its receiver keeps taking deliveries.
func (r remoteAgents) close() { _ = r.c.send("Q") }
