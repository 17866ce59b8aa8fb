// Command wakejoin says what each t3_wait wake-up's time is made of, on both sides of the
// socket, from three inputs of one latency-phase run:
//
//   - a runtime trace of the connector binary (T3CODE_MCP_TRACE, docs/configuration.md), in which
//     every t3_wait result is a log event (category t3_wait, message the thread id);
//   - a runtime trace of the load harness alone (its MCP clients' goroutines), in which every
//     returned wait is a log event of the same kind on the calling goroutine;
//   - the harness's per-wake timestamps, one line each: thread, the first T3 frame showing the
//     settle sent (wall clock, unix ns), the t3_wait result received (unix ns), reason.
//
// Both traces' clocks are CLOCK_MONOTONIC (each trace's ClockSnapshot maps wall to it), so one
// wake's events join across the two processes. For each wake the connector's chain is followed
// back from the handler's wake-up through the goroutines that readied each other to the one the
// network poller readied (the socket's read loop), and the same on the harness's side from the
// caller back to its HTTP read loop; the stages are: the poller's notice after the bytes were in
// the kernel, the waits for a P along the chain, the running in between, the handler's render and
// SSE write, and the share of each wait during which every P of the process was running (Go could
// not have run the goroutine sooner without another P).
//
//	cd scripts/wakejoin && go run . connector.trace harness.trace [wakes.txt]
//
// Without wakes.txt each wake's clock starts when the connector's poller readied its read loop
// (the harness's t3code-load marks each returned wait as loadtest.t3_wait in its -harness-trace,
// so both traces alone give every stage but the first).
//
// Last, the connector's collector: how many of the wakes above 10 and 20 ms had a GC mark phase
// while the connector had them (from the bytes in its kernel to the result logged), against the
// others, and the times of both groups (scripts/gcmarks).
//
// docs/benchmarks.md "Wake: the poller hand-off, by a trace of each process" shows its output.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/exp/trace"

	"github.com/t3code-mcp/t3code-mcp/scripts/gcmarks"
)

type ep struct {
	runnable, running int64 // mono ns; 0 unknown
	by                trace.GoID
	byLabel           string
	byEp              *ep
}

type rec struct {
	thread       string
	g            trace.GoID
	log          int64
	h            ep // the logging goroutine's episode
	written      int64
	end          int64
	sysWrites    int
	lastWriteEnd int64
	sysBefore    int64 // in syscalls between the log and the SSE write
	pBefore      int64 // runnable after a syscall returned without its P, same span
	sysBegin     int64
	sysBeginSDK  bool
	retRunnable  int64
}

type step struct {
	t int64
	n int
}

type side struct {
	procs     []step        // running Ps over time (trace time)
	marks     gcmarks.Marks // the collector's mark phases
	maxP      int
	recs      []*rec
	offset    int64 // add to trace Time to get mono ns
	wallToMon int64 // mono = wall + wallToMon
	first     int64
	last      int64
}

func label(s trace.Stack) string {
	root := ""
	for f := range s.Frames() {
		fn := f.Func
		for _, k := range []struct{ sub, name string }{
			{"effectrpc.(*Conn).readLoop", "readloop"},
			{"threadfeed.(*Feed).run", "feedgo"},
			{"watch.(*Watcher)", "watcher"},
			{"net/http.(*persistConn).readLoop", "h1readloop"},
			{"net/http.(*persistConn).writeLoop", "h1writeloop"},
			{"net/http.(*conn).serve", "httpserve"},
			{"go-sdk/mcp", "sdk"},
			{"loadtest.(*harness).awaitRun", "awaitRun"},
			{"loadtest", "loadtest"},
			{"t3fake", "t3fake"},
			{"tools.", "tools"},
			{"effectrpc", "effectrpc"},
			{"threadfeed", "feed"},
		} {
			if strings.Contains(fn, k.sub) {
				root = k.name
				break
			}
		}
	}
	return root
}

func read(path string, sdkWrite bool) *side {
	f, err := os.Open(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	r, err := trace.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		panic(err)
	}
	s := &side{}
	cur := map[trace.GoID]*ep{}
	pending := map[trace.GoID]*rec{}
	inSys := map[trace.GoID]bool{}
	snapSet := false
	running := map[trace.ProcID]bool{}
	for {
		e, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		t := int64(e.Time())
		if s.first == 0 {
			s.first = t
		}
		s.last = t
		switch e.Kind() {
		case trace.EventRangeBegin, trace.EventRangeActive:
			s.marks.Begin(e.Range().Name, t)
		case trace.EventRangeEnd:
			s.marks.End(e.Range().Name, t)
		case trace.EventSync:
			if cs := e.Sync().ClockSnapshot; cs != nil && !snapSet {
				snapSet = true
				s.offset = int64(cs.Mono) - int64(cs.Trace)
				s.wallToMon = int64(cs.Mono) - cs.Wall.UnixNano()
			}
		case trace.EventLog:
			l := e.Log()
			if l.Category != "t3_wait" && l.Category != "loadtest.t3_wait" {
				continue
			}
			g := e.Goroutine()
			rc := &rec{thread: l.Message, g: g, log: t}
			if c := cur[g]; c != nil {
				rc.h = *c
			}
			s.recs = append(s.recs, rc)
			pending[g] = rc
		case trace.EventStateTransition:
			st := e.StateTransition()
			if st.Resource.Kind == trace.ResourceProc {
				_, to := st.Proc()
				p := st.Resource.Proc()
				if to == trace.ProcRunning {
					running[p] = true
				} else {
					delete(running, p)
				}
				s.maxP = max(s.maxP, int(p)+1)
				s.procs = append(s.procs, step{t, len(running)})
				continue
			}
			if st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			g := st.Resource.Goroutine()
			from, to := st.Goroutine()
			switch {
			case to == trace.GoRunnable && (from == trace.GoWaiting || from == trace.GoNotExist):
				n := &ep{runnable: t, by: e.Goroutine()}
				if n.by != trace.NoGoroutine {
					if c := cur[n.by]; c != nil {
						cp := *c
						n.byEp = &cp
					}
					n.byLabel = label(e.Stack())
				} else {
					n.byLabel = "sys:" + st.Reason
				}
				cur[g] = n
			case to == trace.GoRunning && from == trace.GoRunnable:
				if c := cur[g]; c != nil && c.running == 0 {
					c.running = t
				}
				if rc := pending[g]; rc != nil && rc.retRunnable != 0 {
					rc.pBefore += t - rc.retRunnable
					rc.retRunnable = 0
				}
			case to == trace.GoSyscall:
				inSys[g] = true
				if rc := pending[g]; rc != nil && rc.written == 0 {
					rc.sysBegin = t
					rc.sysBeginSDK = strings.Contains(st.Stack.String(), "net/http.")
				}
			case from == trace.GoSyscall:
				if inSys[g] {
					delete(inSys, g)
					if rc := pending[g]; rc != nil {
						isSDK := rc.sysBeginSDK
						if rc.written == 0 && !(sdkWrite && isSDK) && rc.sysBegin != 0 {
							rc.sysBefore += t - rc.sysBegin
							if to == trace.GoRunnable {
								rc.retRunnable = t
							}
						}
						rc.sysWrites++
						rc.lastWriteEnd = t
						if rc.written == 0 && (!sdkWrite || isSDK) {
							rc.written = t
						}
					}
				}
				if to == trace.GoRunnable {
					// Returned from a syscall without its P: waits for one again.
					cur[g] = &ep{runnable: t, by: trace.NoGoroutine, byLabel: "syscall-return"}
				}
			case from == trace.GoRunning && (to == trace.GoWaiting || to == trace.GoNotExist):
				if rc := pending[g]; rc != nil {
					rc.end = t
					delete(pending, g)
				}
			}
		}
	}
	return s
}

type wake struct {
	thread   string
	sent, at int64 // wall ns
}

func readWakes(path string) []wake {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	var out []wake
	for _, ln := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(ln)
		if len(f) < 3 {
			continue
		}
		s, _ := strconv.ParseInt(f[1], 10, 64)
		a, _ := strconv.ParseInt(f[2], 10, 64)
		out = append(out, wake{f[0], s, a})
	}
	return out
}

func ms(d int64) float64 { return float64(d) / 1e6 }

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

func main() {
	conn := read(os.Args[1], true)
	harn := read(os.Args[2], false)
	var wakes []wake
	if len(os.Args) > 3 {
		wakes = readWakes(os.Args[3])
	} else {
		// No per-wake times: one wake per harness mark, its clock starting at the connector's
		// read loop readied by the poller (the kernel -> poller stage is not known).
		fmt.Println("no wakes file: each wake starts when the connector's poller readied its read loop; the first stage is 0")
		for _, r := range harn.recs {
			wakes = append(wakes, wake{thread: r.thread, at: r.log + harn.offset - harn.wallToMon})
		}
	}
	fmt.Printf("GOMAXPROCS by trace: connector %d, harness %d\n", conn.maxP, harn.maxP)
	fmt.Printf("connector trace: %d t3_wait logs, %.2f s; harness trace: %d logs, %.2f s\n",
		len(conn.recs), float64(conn.last-conn.first)/1e9, len(harn.recs), float64(harn.last-harn.first)/1e9)
	fmt.Printf("clock: connector trace->mono offset %d ns, harness %d ns; wall->mono %d / %d\n", conn.offset, harn.offset, conn.wallToMon, harn.wallToMon)
	// Index by thread, in mono time.
	cBy := map[string][]*rec{}
	for _, r := range conn.recs {
		cBy[r.thread] = append(cBy[r.thread], r)
	}
	hBy := map[string][]*rec{}
	for _, r := range harn.recs {
		hBy[r.thread] = append(hBy[r.thread], r)
	}
	cm := func(t int64) int64 { return t + conn.offset }
	hm := func(t int64) int64 { return t + harn.offset }
	names := []string{
		"conn: sent -> first goroutine readied by the poller",
		"conn: waiting for a P (every hand-off of the chain)",
		"conn: running up to the handler's wake (chain)",
		"conn: handler running -> result logged",
		"conn: result logged -> SSE write done",
		"conn:   of it: in syscalls before the SSE write",
		"conn:   of it: waiting for a P after such a syscall",
		"harn: write done -> first goroutine readied by poller",
		"harn: waiting for a P (every hand-off of the chain)",
		"harn: running up to the caller's wake (chain)",
		"harn: caller running -> at",
		"%% conn all Ps busy: sent -> poller readied",
		"%% conn all Ps busy: first goroutine's P wait",
		"%% harn all Ps busy: write -> poller readied",
		"%% harn all Ps busy: first goroutine's P wait",
	}
	type row struct {
		total  float64
		st     []float64
		labels string
		conn   gcmarks.Span // sent to the result logged, in the connector's trace time
	}
	chain := func(last ep) ([]ep, string, bool) {
		var c []ep
		e := &last
		for d := 0; e != nil && d < 8; d++ {
			c = append([]ep{*e}, c...)
			if e.by == trace.NoGoroutine {
				return c, e.byLabel, true
			}
			e = e.byEp
		}
		return c, "", false
	}
	chainLabel := func(c []ep) string {
		var p []string
		for _, e := range c[1:] {
			p = append(p, e.byLabel)
		}
		return strings.Join(p, ">")
	}
	var rows []row
	miss := map[string]int{}
	for _, w := range wakes {
		sent := w.sent + harn.wallToMon
		at := w.at + harn.wallToMon
		if w.sent == 0 {
			sent = at - 10_000_000_000 // the latest connector result of the thread before at
		}
		var c, h *rec
		for _, r := range cBy[w.thread] {
			if m := cm(r.log); m > sent && m < at {
				c = r
			}
		}
		for _, r := range hBy[w.thread] {
			if m := hm(r.log); m >= at-1_000_000 && m < at+5_000_000 {
				h = r
			}
		}
		if c == nil || h == nil {
			if c == nil {
				miss["no connector log"]++
			} else {
				miss["no harness log"]++
			}
			continue
		}
		cc, cwhy, ok1 := chain(c.h)
		hc, hwhy, ok2 := chain(h.h)
		if !ok1 || !ok2 {
			miss["chain not back to the poller"]++
			continue
		}
		if w.sent == 0 {
			sent = cm(cc[0].runnable)
		}
		bad := false
		// from: the moment the bytes were in the kernel (in the side's trace time); a chain
		// whose first goroutine was readied or running before it (a read loop already busy with
		// earlier frames) counts only from then on.
		sum := func(ch []ep, from int64) (notice, pw, work float64) {
			for i, e := range ch {
				if e.runnable == 0 || e.running == 0 {
					bad = true
				}
				rn, ru := e.runnable, e.running
				if i == 0 {
					notice = ms(max(0, rn-from))
					rn = max(rn, from)
					ru = max(ru, rn)
				}
				pw += ms(ru - rn)
				if i+1 < len(ch) {
					work += ms(ch[i+1].runnable - ru)
				}
			}
			return
		}
		wr := c.written
		if wr == 0 {
			wr = c.end
		}
		cnotice, cpw, cwork := sum(cc, sent-conn.offset)
		hnotice, hpw, hwork := sum(hc, cm(wr)-harn.offset)
		if bad {
			miss["an episode began before the trace"]++
			continue
		}
		st := []float64{
			cnotice, cpw, cwork,
			ms(c.log - c.h.running), ms(wr - c.log), ms(c.sysBefore), ms(c.pBefore),
			hnotice, hpw, hwork,
			ms(at - hm(h.h.running)),
		}
		cs, hs := sent-conn.offset, cm(wr)-harn.offset
		st = append(st, 100*conn.allBusy(cs, cc[0].runnable), 100*conn.allBusy(max(cs, cc[0].runnable), cc[0].running),
			100*harn.allBusy(hs, hc[0].runnable), 100*harn.allBusy(max(hs, hc[0].runnable), hc[0].running))
		rows = append(rows, row{total: ms(at - sent), st: st, labels: fmt.Sprintf("conn %s [%s] | harn %s [%s]", chainLabel(cc), cwhy, chainLabel(hc), hwhy), conn: gcmarks.Span{Begin: sent - conn.offset, End: c.log}})
	}
	fmt.Printf("joined %d of %d wakes; not joined: %v\n", len(rows), len(wakes), miss)
	defer func() {
		ws := make([]gcmarks.Item, len(rows))
		for i, r := range rows {
			ws[i] = gcmarks.Item{Span: r.conn, MS: r.total}
		}
		gcmarks.Report(os.Stdout, "wakes", conn.marks.Spans, ws, 10, 20)
	}()
	var tot []float64
	for _, r := range rows {
		tot = append(tot, r.total)
	}
	fmt.Printf("total (sent -> at) p50 %.2f p90 %.2f p99 %.2f max %.2f ms\n", pct(tot, .5), pct(tot, .9), pct(tot, .99), pct(tot, 1))
	fmt.Printf("%-52s %8s %8s %8s %8s | %s\n", "stage", "p50", "p90", "p99", "max", "mean share in the slowest 5% / 1%")
	slices.SortFunc(rows, func(a, b row) int {
		if a.total < b.total {
			return -1
		}
		if a.total > b.total {
			return 1
		}
		return 0
	})
	n5 := max(1, len(rows)/20)
	n1 := max(1, len(rows)/100)
	for i, name := range names {
		var v []float64
		for _, r := range rows {
			v = append(v, r.st[i])
		}
		var s5, s1 float64
		for _, r := range rows[len(rows)-n5:] {
			s5 += r.st[i]
		}
		for _, r := range rows[len(rows)-n1:] {
			s1 += r.st[i]
		}
		unit := "ms"
		if strings.HasPrefix(name, "%%") {
			unit = "% "
		}
		fmt.Printf("%-52s %8.3f %8.3f %8.3f %8.3f | %7.2f %s / %7.2f %s\n", name, pct(v, .5), pct(v, .9), pct(v, .99), pct(v, 1), s5/float64(n5), unit, s1/float64(n1), unit)
	}
	var t5, t1 float64
	for _, r := range rows[len(rows)-n5:] {
		t5 += r.total
	}
	for _, r := range rows[len(rows)-n1:] {
		t1 += r.total
	}
	fmt.Printf("%-52s %35s | %7.2f ms / %7.2f ms\n", "total", "", t5/float64(n5), t1/float64(n1))
	// The stages' p99 do not add up; the slowest 1 %'s mean shares do.
	lc := map[string]int{}
	for _, r := range rows {
		lc[r.labels]++
	}
	for k, v := range lc {
		fmt.Printf("%5d  %s\n", v, k)
	}
	if os.Getenv("SLOWEST") != "" {
		for _, r := range rows[len(rows)-n1:] {
			fmt.Printf("slow %.2f: %v %s\n", r.total, r.st, r.labels)
		}
	}
}

// allBusy is the share of [a, b] (trace time) during which every P was running.
func (s *side) allBusy(a, b int64) float64 {
	if b <= a {
		return 0
	}
	i, _ := slices.BinarySearchFunc(s.procs, a, func(x step, t int64) int {
		if x.t < t {
			return -1
		}
		if x.t > t {
			return 1
		}
		return 0
	})
	n := 0
	if i > 0 {
		n = s.procs[i-1].n
	}
	cur, busy := a, int64(0)
	for ; i < len(s.procs) && s.procs[i].t < b; i++ {
		if n >= s.maxP {
			busy += s.procs[i].t - cur
		}
		cur, n = s.procs[i].t, s.procs[i].n
	}
	if n >= s.maxP {
		busy += b - cur
	}
	return float64(busy) / float64(b-a)
}
