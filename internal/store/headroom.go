package store

import (
	"os"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// The file's written headroom. bbolt grows its file with ftruncate, which leaves the new tail a
// hole, and its high-water mark (the end of the pages in use) moves up into that hole as events
// are appended (~1.3 MB/s at 1,000 transitions/s: about every other group commit writes a page
// past the old mark). Writing into a hole makes ext4 allocate blocks, so that commit's fdatasync
// must also commit the filesystem's journal, which carries every other writer's metadata on the
// filesystem too (a build next door, a log). Measured on this project's VM (docs/benchmarks.md,
// "fdatasync into a hole"): 16 KiB written then fdatasync, p50 / p99 0.17 / 4.0 ms over written
// blocks against 0.46 / 10.4 ms into a hole.
//
// So the store keeps the bytes just past bbolt's high-water mark written with zeros and durable,
// headroomAhead of them: bbolt's pages then land on allocated blocks and its fdatasync writes data
// only. Only bytes at or past the high-water mark are written, under bbolt's writer lock (a write
// transaction begun and rolled back), so no page bbolt uses or is about to write is touched; bbolt
// ignores what lies past the mark (a file longer than its pages is what its own growth makes).
// A crash in the middle leaves zeros past the mark, which is the same. It is best effort: a
// failure (a full disk) only stops it until headroomRetry commits later; bbolt's own writes then
// report the disk's state as before.

const (
	// headroomAhead is how far past the high-water mark the file is kept written.
	headroomAhead = 4 << 20
	// headroomStep is the most written (and made durable) at a time: the step runs between two
	// commits, holding bbolt's writer lock, so it is kept short.
	headroomStep = 1 << 20
	// headroomRetry is how many commits a failed step waits before the next try.
	headroomRetry = 1000
)

// headroom keeps bbolt's file written past its high-water mark (Bolt.keepHeadroom).
type headroom struct {
	mu      sync.Mutex
	off     bool  // disabled (tests and benchmarks that measure without it)
	through int64 // the file's bytes [mark, through) are known written and durable
	mark    int64 // the high-water mark last seen
	wait    int   // commits left before a failed step is tried again
	zeros   []byte
}

// keepHeadroom writes zeros past bbolt's high-water mark, headroomStep a call, while less than
// headroomAhead of it is written. The group commit's writer calls it after each transaction,
// once the transaction's callers are released.
func (s *Bolt) keepHeadroom() {
	h := &s.headroom
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.off {
		return
	}
	if h.wait > 0 {
		h.wait--
		return
	}
	tx, err := s.db.Begin(true) // bbolt's writer lock: no commit runs while the zeros are written
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback() }()
	mark := tx.Size()
	if mark == h.mark && h.through-mark >= headroomAhead {
		return // the common case: nothing moved since the last look
	}
	if mark != h.mark {
		// bbolt may have grown the file (ftruncate) since: a length below what was written
		// means it was cut, so only what is still there counts.
		if fi, err := os.Stat(s.path); err == nil && fi.Size() < h.through {
			h.through = fi.Size()
		}
		h.mark = mark
	}
	if h.through < mark {
		h.through = mark
	}
	if h.through-mark >= headroomAhead {
		return
	}
	if err := h.write(s.path, h.through+headroomStep); err != nil {
		h.wait = headroomRetry
	}
}

// write zeros the file from h.through to end and makes them durable.
func (h *headroom) write(path string, end int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if h.zeros == nil {
		h.zeros = make([]byte, headroomStep)
	}
	if _, err := f.WriteAt(h.zeros[:end-h.through], h.through); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	h.through = end
	return nil
}

// headroomKeeper is a store that keeps its file's headroom written (the bbolt one).
type headroomKeeper interface{ keepHeadroom() }

var _ headroomKeeper = (*Bolt)(nil)

// txSize is bbolt's high-water mark as a read transaction sees it (for tests).
func txSize(db *bolt.DB) (int64, error) {
	var n int64
	err := db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return n, err
}
