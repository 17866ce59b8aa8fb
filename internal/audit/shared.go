package audit

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Table is the audit log's table in a database several replicas share (internal/store/pgstore's
// t3_audit). AppendAudit stores records in one statement, all or none; a record whose line is
// already stored is skipped, so storing a batch again is harmless.
type Table interface {
	AppendAudit(ctx context.Context, recs []Record) error
}

// Defaults for SharedOptions.
const (
	// defaultBuffer is how many records wait for the database before records go to the file.
	defaultBuffer = 10_000
	// DefaultBatch is the most records one insert carries.
	DefaultBatch = 500
	// defaultInsertTimeout bounds one insert.
	defaultInsertTimeout = 10 * time.Second
	// defaultCloseTimeout bounds the last inserts at Close; what they do not store goes to the file.
	defaultCloseTimeout = 5 * time.Second
)

// SharedOptions tune a Shared log.
type SharedOptions struct {
	Replica       string // set on every record (Record.Replica)
	Buffer        int    // default defaultBuffer
	Batch         int    // default DefaultBatch
	InsertTimeout time.Duration
	CloseTimeout  time.Duration
	Logger        *slog.Logger
}

// Shared is the audit log of replicas sharing PostgreSQL: records go to the database's table,
// so every replica's calls are in one place, written off the tool call's path.
//
// Write never waits for the database: it puts the record in a buffer of Buffer records and
// returns; one goroutine inserts what the buffer holds, in batches, retrying with backoff while
// the database fails. When the buffer is full (the database is away or slower than the calls),
// the record is appended to this replica's own audit file (Log, in the state directory) instead:
// a record is never dropped and a call never blocks on the database. The same happens to what
// is still buffered when Close cannot store it within CloseTimeout. Spilled counts those records;
// `t3code-mcp audit` prints the table's records and then the file's.
type Shared struct {
	table Table
	file  *Log
	o     SharedOptions

	mu     sync.RWMutex // Write holds it shared; Close exclusively, to close queue once
	closed bool
	queue  chan Record

	stop    chan struct{} // closed by Close: give up retrying, flush, exit
	done    chan struct{} // closed when the writer goroutine has exited
	spilled atomic.Int64
	stored  atomic.Int64
}

// NewShared starts the writer goroutine; Close stops it. file is the fallback (see Shared).
func NewShared(table Table, file *Log, o SharedOptions) *Shared {
	if o.Buffer <= 0 {
		o.Buffer = defaultBuffer
	}
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.InsertTimeout <= 0 {
		o.InsertTimeout = defaultInsertTimeout
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = defaultCloseTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Shared{table: table, file: file, o: o, queue: make(chan Record, o.Buffer),
		stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

// Write queues r for the database, or appends it to the file when the buffer is full or the
// log is closed. It never waits for the database.
func (s *Shared) Write(r Record) error {
	r = r.normalized()
	r.Replica = s.o.Replica
	if _, err := r.Line(); err != nil { // refused now, not lost later in the batch
		return err
	}
	s.mu.RLock()
	if !s.closed {
		select {
		case s.queue <- r:
			s.mu.RUnlock()
			return nil
		default:
		}
	}
	s.mu.RUnlock()
	return s.spill([]Record{r}, "the database buffer is full")
}

// Spilled is how many records went to the file instead of the database.
func (s *Shared) Spilled() int64 { return s.spilled.Load() }

// File is the fallback file.
func (s *Shared) File() *Log { return s.file }

// spill appends records to the file. The first spill after records reached the database is
// logged as a warning, later ones only count (a database away would flood the log).
func (s *Shared) spill(recs []Record, why string) error {
	var errs []error
	for _, r := range recs {
		errs = append(errs, s.file.Write(r))
	}
	if n := s.spilled.Add(int64(len(recs))); n == int64(len(recs)) || n%1000 < int64(len(recs)) {
		s.o.Logger.Warn("audit records written to this replica's audit file instead of the database", "why", why, "file", s.file.Path(), "spilled_total", n)
	}
	return errors.Join(errs...)
}

func (s *Shared) run() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-s.done:
		}
	}()
	batch := make([]Record, 0, s.o.Batch)
	for {
		select {
		case r, ok := <-s.queue:
			if !ok {
				return
			}
			batch = s.fill(append(batch[:0], r))
			if err := s.insert(ctx, batch); err != nil {
				// Closing, the database still failing: this batch and the rest go through
				// Close's last attempt below.
				s.finish(batch)
				return
			}
		case <-s.stop:
			s.finish(nil)
			return
		}
	}
}

// fill takes what else is buffered, up to a batch.
func (s *Shared) fill(batch []Record) []Record {
	for len(batch) < s.o.Batch {
		select {
		case r, ok := <-s.queue:
			if !ok {
				return batch
			}
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// insert stores a batch, retrying with backoff until it is stored or ctx ends (Close).
func (s *Shared) insert(ctx context.Context, batch []Record) error {
	failed := false
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		ictx, cancel := context.WithTimeout(ctx, s.o.InsertTimeout)
		defer cancel()
		err := s.table.AppendAudit(ictx, batch)
		if err != nil && !failed && ctx.Err() == nil {
			failed = true
			s.o.Logger.Warn("audit records not stored in the database yet; retrying (the buffer holds new ones meanwhile)", "records", len(batch), "err", err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(backoff.NewExponentialBackOff()), backoff.WithMaxElapsedTime(0))
	if err == nil {
		s.stored.Add(int64(len(batch)))
	}
	return err
}

// finish is the writer's last act at Close: pending (a batch that failed) and what is left in
// the buffer get one more attempt within CloseTimeout; what that does not store goes to the file.
func (s *Shared) finish(pending []Record) {
	rest := append([]Record(nil), pending...)
	for r := range s.queue { // Close closed it: this ends
		rest = append(rest, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.o.CloseTimeout)
	defer cancel()
	for len(rest) > 0 {
		n := min(len(rest), s.o.Batch)
		if err := s.table.AppendAudit(ctx, rest[:n]); err != nil {
			_ = s.spill(rest, "the database did not take them before shutdown: "+err.Error())
			return
		}
		s.stored.Add(int64(n))
		rest = rest[n:]
	}
}

// Close stores what is buffered (within CloseTimeout; the rest goes to the file), stops the
// writer and closes the file. Later writes go to the (closed) file and fail.
func (s *Shared) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.queue)
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	return s.file.Close()
}
