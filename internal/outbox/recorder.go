package outbox

import (
	"sync"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// recorder records the workers' outcomes in batches: it takes every outcome waiting (up to
// maxBatch), applies all their ops in one store transaction — one fsync for all — and hands them
// to the loop, which only then lets a stream move on to its next event. While one batch is being
// written the next one gathers, so the batches grow with the load and the fsyncs per event
// shrink.
//
// Neither side of it ever waits for the other: a worker drops its outcome in the recorder's
// mailbox and frees its slot at once, however long the record takes (with bbolt, Group.Record
// waits for the detector's next group commit, which under a heavy commit load is a long
// transaction), and the recorder drops the recorded batch in the loop's mailbox. So the rate of
// deliveries is that of the requests in flight, not the outcomes a bounded channel could hold per
// commit cycle; the loop bounds the outcomes not yet recorded (maxUnrecorded). It returns once
// stop is closed and its mailbox is empty.
func (o *Outbox) recorder(in, out *mailbox, stop <-chan struct{}) {
	var batch []outcome
	ops := make([]store.Op, 0, maxBatch)
	idx := make([]int, 0, maxBatch) // ops[j] is batch[idx[j]]'s
	for {
		batch = in.take(batch[:0], maxBatch)
		if len(batch) == 0 {
			select {
			case <-in.ready:
				continue
			case <-stop:
				if batch = in.take(batch[:0], maxBatch); len(batch) == 0 {
					return
				}
			}
		}
		ops, idx = ops[:0], idx[:0]
		for i := range batch {
			if batch[i].op != nil && batch[i].err == nil {
				ops = append(ops, *batch[i].op)
				idx = append(idx, i)
			}
		}
		if len(ops) > 0 {
			errs, err := o.q.Record(ops)
			for j, i := range idx {
				if err != nil {
					batch[i].err = err
				} else {
					batch[i].err = errs[j]
				}
			}
			o.m.recordBatch.Observe(float64(len(ops)))
		}
		out.put(batch...)
		clear(batch) // the loop has its copies; the bodies must not stay reachable from here
	}
}

// mailbox hands outcomes from goroutines to one receiver without blocking the sender: put
// appends and signals ready (a pending signal is enough for any number of puts); the receiver
// waits on ready and takes what has gathered. Its size is bounded by whoever starts the work
// (the loop: at most maxUnrecorded deliveries unrecorded).
type mailbox struct {
	mu    sync.Mutex
	items []outcome
	ready chan struct{}
}

func newMailbox() *mailbox { return &mailbox{ready: make(chan struct{}, 1)} }

func (m *mailbox) put(rs ...outcome) {
	m.mu.Lock()
	m.items = append(m.items, rs...)
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

// take appends up to limit waiting outcomes (limit <= 0: all) to buf, oldest first, and returns
// it. When some are left it signals ready again, so the receiver comes back for them.
func (m *mailbox) take(buf []outcome, limit int) []outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.items)
	if limit > 0 {
		n = min(n, limit)
	}
	buf = append(buf, m.items[:n]...)
	rest := copy(m.items, m.items[n:])
	clear(m.items[rest:])
	m.items = m.items[:rest]
	if rest > 0 {
		select {
		case m.ready <- struct{}{}:
		default:
		}
	}
	return buf
}
