// Command tracejoin joins, per event, the outbox's trace marks (t3mcp.durable, t3mcp.enrich,
// t3mcp.attempt, t3mcp.written, t3mcp.answered: internal/outbox/tracemarks.go) and the load
// harness receiver's (loadtest.received) with the goroutines' state changes (waiting, made
// runnable, running), and prints each stage of an event's way from "durable" to "the receiver has
// it" (p50/p90/p99/max), for all events, the enriched ones and the others, and the mean of each
// stage over the slowest 1 % (where the tail is made). Give it one or more runtime traces: an
// in-process `t3code-load -trace F` (connector and harness in one), or the connector binary's
// (T3CODE_MCP_TRACE) beside a trace of the harness process; traces of two processes join
// because Go's trace clock is CLOCK_MONOTONIC. Without receiver marks the answer's wake-up is
// counted from the request written. A module of its own: golang.org/x/exp/trace is not one of
// the connector's dependencies. With TRACEJOIN_EVENTS set it also prints one line per joined event
// (T3's time, durable, attempt, received, answered in ms since the traces' first event, the
// delivery worker's goroutine, enriched or not), so that a burst — events that were made durable
// by the same transaction — can be followed event by event. Traces with no event in common say
// so (and that the windows must overlap) instead of failing. Last, the first trace's (the
// connector's) collector: how many of the events above 50 and 100 ms (T3's time to received) had
// a GC mark phase during them, against the others, and the times of both groups (scripts/gcmarks).
//
//	cd scripts/tracejoin && go run . connector.trace [harness.trace]
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/exp/trace"

	"github.com/t3code-mcp/t3code-mcp/scripts/gcmarks"
)

type tr struct {
	t  trace.Time
	to trace.GoState
	by trace.GoID
}

type mark struct {
	t trace.Time
	g trace.GoID
}

type ev struct {
	durable  *mark
	lag      int64 // µs
	attempt  *mark
	answered *mark
	received *mark
	enrich   *mark
}

func main() {
	perEvent := os.Getenv("TRACEJOIN_EVENTS") != "" // one line per joined event as well
	gs := map[trace.GoID][]tr{}
	written := map[trace.GoID][]trace.Time{}
	evs := map[string]*ev{}
	get := func(id string) *ev {
		e := evs[id]
		if e == nil {
			e = &ev{}
			evs[id] = e
		}
		return e
	}
	var first, last trace.Time
	var marks gcmarks.Marks // the first trace's (the connector's) GC mark phases
	for fi, name := range os.Args[1:] {
		// Goroutine ids of each file (process) apart.
		gid := func(g trace.GoID) trace.GoID {
			if g == trace.NoGoroutine {
				return g
			}
			return g + trace.GoID(fi)<<40
		}
		f, err := os.Open(name)
		if err != nil {
			panic(err)
		}
		r, err := trace.NewReader(f)
		if err != nil {
			panic(err)
		}
		for {
			e, err := r.ReadEvent()
			if err == io.EOF {
				break
			}
			if err != nil {
				panic(err)
			}
			if first == 0 || e.Time() < first {
				first = e.Time()
			}
			last = max(last, e.Time())
			switch e.Kind() {
			case trace.EventRangeBegin, trace.EventRangeActive:
				if fi == 0 {
					marks.Begin(e.Range().Name, int64(e.Time()))
				}
			case trace.EventRangeEnd:
				if fi == 0 {
					marks.End(e.Range().Name, int64(e.Time()))
				}
			case trace.EventStateTransition:
				st := e.StateTransition()
				if st.Resource.Kind != trace.ResourceGoroutine {
					continue
				}
				_, to := st.Goroutine()
				g := gid(st.Resource.Goroutine())
				gs[g] = append(gs[g], tr{e.Time(), to, gid(e.Goroutine())})
			case trace.EventLog:
				l := e.Log()
				m := &mark{e.Time(), gid(e.Goroutine())}
				switch l.Category {
				case "t3mcp.durable":
					id, lag, _ := strings.Cut(l.Message, " ")
					x := get(id)
					if x.durable == nil {
						x.durable = m
						x.lag, _ = strconv.ParseInt(lag, 10, 64)
					}
				case "t3mcp.attempt":
					x := get(l.Message)
					if x.attempt == nil {
						x.attempt = m
					}
				case "t3mcp.enrich":
					x := get(l.Message)
					if x.enrich == nil {
						x.enrich = m
					}
				case "t3mcp.answered":
					x := get(l.Message)
					if x.answered == nil {
						x.answered = m
					}
				case "t3mcp.written":
					written[m.g] = append(written[m.g], m.t)
				case "loadtest.received":
					x := get(l.Message)
					if x.received == nil {
						x.received = m
					}
				}
			}
		}
		f.Close()
	}
	for g := range gs {
		sort.Slice(gs[g], func(i, j int) bool { return gs[g][i].t < gs[g][j].t })
	}
	noRecv := true
	for _, x := range evs {
		if x.received != nil {
			noRecv = false
			break
		}
	}
	ms := func(d trace.Time) float64 { return float64(d) / 1e6 }
	// lastBefore: the last transition of g to state s at or before t.
	lastBefore := func(g trace.GoID, s trace.GoState, t trace.Time) (tr, bool) {
		l := gs[g]
		i := sort.Search(len(l), func(i int) bool { return l[i].t > t })
		for i--; i >= 0; i-- {
			if l[i].to == s {
				return l[i], true
			}
		}
		return tr{}, false
	}
	firstAfter := func(g trace.GoID, s trace.GoState, t, until trace.Time) (tr, bool) {
		l := gs[g]
		i := sort.Search(len(l), func(i int) bool { return l[i].t >= t })
		for ; i < len(l) && l[i].t <= until; i++ {
			if l[i].to == s {
				return l[i], true
			}
		}
		return tr{}, false
	}
	names := []string{
		"T3 -> durable (lag at hand-over)",
		"durable -> attempt start",
		"  durable -> worker made runnable (woken for its job)",
		"  worker runnable -> running",
		"attempt start -> request written",
		"written -> receiver goroutine runnable (harness netpoll)",
		"receiver runnable -> running",
		"receiver running -> handler (received)",
		"received -> worker runnable (answer written, connector netpoll)",
		"worker runnable -> running (answer)",
		"worker running -> answered",
		"attempt -> answered (round trip)",
		"durable -> received",
		"T3 -> received",
		"enriched (1) or not (0)",
	}
	const nst = 15
	var rows [][nst]float64  // NaN-free: -1 = unknown
	var spans []gcmarks.Item // per row: T3's time to received (or answered)
	joined := 0
	byScheduler, byOther := 0, 0
	jobByWriter := map[trace.GoID]int{}
	for _, x := range evs {
		if x.durable == nil || x.attempt == nil || x.answered == nil || (x.received == nil && !noRecv) {
			continue
		}
		if x.received == nil { // connector trace only: the answer's wake from the request written
			x.received = &mark{t: -1}
		}
		joined++
		var row [nst]float64
		for i := range row {
			row[i] = -1
		}
		row[0] = float64(x.lag) / 1000
		row[1] = ms(x.attempt.t - x.durable.t)
		gw := x.attempt.g
		if run, ok := lastBefore(gw, trace.GoRunning, x.attempt.t); ok && run.t >= x.durable.t {
			if rb, ok := lastBefore(gw, trace.GoRunnable, run.t); ok && rb.t >= x.durable.t {
				row[2] = ms(rb.t - x.durable.t)
				row[3] = ms(run.t - rb.t)
				jobByWriter[rb.by]++
			}
		}
		// written: first on gw after the attempt
		var tw trace.Time
		for _, t := range written[gw] {
			if t >= x.attempt.t && t <= x.answered.t {
				tw = t
				break
			}
		}
		if tw != 0 {
			row[4] = ms(tw - x.attempt.t)
			from := x.received.t
			if x.received.t >= 0 {
				gr := x.received.g
				if run, ok := lastBefore(gr, trace.GoRunning, x.received.t); ok && run.t >= tw {
					if rb, ok := lastBefore(gr, trace.GoRunnable, run.t); ok && rb.t >= tw {
						row[5] = ms(rb.t - tw)
						row[6] = ms(run.t - rb.t)
						row[7] = ms(x.received.t - run.t)
					}
				} else {
					row[7] = ms(x.received.t - tw) // the receiver goroutine did not block
				}
			} else {
				from = tw // no receiver marks: the answer's wake counted from the request written
			}
			if rb, ok := firstAfter(gw, trace.GoRunnable, from, x.answered.t); ok {
				row[8] = ms(rb.t - from)
				if rb.by == trace.NoGoroutine {
					byScheduler++
				} else {
					byOther++
				}
				if run, ok := firstAfter(gw, trace.GoRunning, rb.t, x.answered.t); ok {
					row[9] = ms(run.t - rb.t)
					row[10] = ms(x.answered.t - run.t)
				}
			}
		}
		row[11] = ms(x.answered.t - x.attempt.t)
		if x.received.t >= 0 {
			row[12] = ms(x.received.t - x.durable.t)
			row[13] = row[0] + row[12]
		} else {
			row[12] = ms(x.answered.t - x.durable.t) // durable -> answered
			row[13] = row[0] + row[12]
		}
		row[14] = 0
		if x.enrich != nil {
			row[14] = 1
		}
		rows = append(rows, row)
		end := x.received.t
		if end < 0 {
			end = x.answered.t
		}
		begin := x.durable.t - trace.Time(x.lag*1000)
		spans = append(spans, gcmarks.Item{Span: gcmarks.Span{Begin: int64(begin), End: int64(end)}, MS: ms(end - begin)})
		if perEvent {
			recv := -1.0
			if x.received.t >= 0 {
				recv = ms(x.received.t - first)
			}
			fmt.Printf("event T3=%.2f durable=%.2f attempt=%.2f received=%.2f answered=%.2f worker=%d enriched=%v\n",
				ms(x.durable.t-first)-float64(x.lag)/1000, ms(x.durable.t-first), ms(x.attempt.t-first), recv, ms(x.answered.t-first), x.attempt.g, x.enrich != nil)
		}
	}
	if perEvent {
		fmt.Printf("first %d\n", first)
	}
	fmt.Printf("window %.2f s, events joined %d of %d seen\n", ms(last-first)/1000, joined, len(evs))
	if joined == 0 {
		fmt.Println("no event joined: do the traces' windows overlap (the connector's T3CODE_MCP_TRACE_AFTER counts from its start, the harness's -trace-after from the phase's)?")
		return
	}
	for _, sel := range []float64{-1, 0, 1} {
		fmt.Printf("\n[%s]\n%-64s %6s %7s %7s %7s %7s %7s\n", map[float64]string{-1: "all", 0: "not enriched", 1: "enriched"}[sel], "stage", "n", "p50", "p90", "p99", "max", "mean")
		for i, n := range names {
			var v []float64
			for _, r := range rows {
				if r[i] >= 0 && (sel < 0 || r[14] == sel) {
					v = append(v, r[i])
				}
			}
			sort.Float64s(v)
			if len(v) == 0 {
				continue
			}
			sum := 0.0
			for _, x := range v {
				sum += x
			}
			q := func(p float64) float64 { return v[min(len(v)-1, int(p*float64(len(v))))] }
			fmt.Printf("%-64s %6d %7.2f %7.2f %7.2f %7.2f %7.2f\n", n, len(v), q(.5), q(.9), q(.99), v[len(v)-1], sum/float64(len(v)))
		}
	}
	gcmarks.Report(os.Stdout, "events", marks.Spans, spans, 50, 100)
	fmt.Printf("answer wake-ups by the scheduler (netpoll, no goroutine) %d, by a goroutine %d\n", byScheduler, byOther)
	type kv struct {
		g trace.GoID
		n int
	}
	var ws []kv
	for g, n := range jobByWriter {
		ws = append(ws, kv{g, n})
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].n > ws[j].n })
	if len(ws) > 5 {
		ws = ws[:5]
	}
	fmt.Printf("worker woken for its job by goroutines (top): %v\n", ws)
	// The tail: for the slowest 1 % by T3 -> received and by durable -> received, the mean of each stage.
	for _, key := range []int{13, 12} {
		sort.Slice(rows, func(i, j int) bool { return rows[i][key] > rows[j][key] })
		n := max(1, len(rows)/100)
		fmt.Printf("\nslowest 1%% (%d) by %s (from %.1f ms): mean per stage\n", n, names[key], rows[n-1][key])
		for i, nm := range names {
			s, c := 0.0, 0
			for _, r := range rows[:n] {
				if r[i] >= 0 {
					s += r[i]
					c++
				}
			}
			if c > 0 {
				fmt.Printf("  %-64s %7.2f (n %d)\n", nm, s/float64(c), c)
			}
		}
	}
}
