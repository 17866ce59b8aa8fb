package outbox

import "github.com/t3code-mcp/t3code-mcp/internal/store"

// recorder records the workers' outcomes in batches: it takes the first outcome that arrives and
// every other one already waiting (up to maxBatch), applies all their ops in one store
// transaction — one fsync for all — and hands them to the loop, which only then lets a stream
// move on to its next event. While one batch is being written the next one gathers, so the
// batches grow with the load and the fsyncs per event shrink. It returns when in is closed.
func (o *Outbox) recorder(in <-chan outcome, out chan<- outcome) {
	batch := make([]outcome, 0, maxBatch)
	ops := make([]store.Op, 0, maxBatch)
	idx := make([]int, 0, maxBatch) // ops[j] is batch[idx[j]]'s
	for first := range in {
		batch = append(batch[:0], first)
	gather:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-in:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
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
		for _, r := range batch {
			out <- r
		}
	}
}
