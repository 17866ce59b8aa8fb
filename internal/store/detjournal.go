package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// The detector's state is one small value per watched thread under a key that says nothing of
// when it was written (machine, thread), and a run changes it twice (its start and its end). Put
// straight into its bucket, every change rewrites a random 4 KiB leaf page of a bucket of
// thousands of pages: at 5,000 transitions/s that was 3.5 of the 5 pages (spilled, written and
// fsynced) each event cost, more than the event itself (docs/benchmarks.md, "Issue 12: deliver").
//
// So a change is journaled instead: appended under the next sequence number of a journal bucket
// (the pages written are the journal's tail, shared by every change of a transaction) and kept
// in memory (the overlay) until a later transaction checkpoints it into the detector bucket. A
// checkpoint pass takes the overlay's keys in key order, a slice per transaction, once the
// overlay holds many keys per page of the bucket (detOverlayShare): a slice's changes then share
// their leaf pages, and a thread's start and end that met in the overlay are written once.
// Journal records are never deleted one by one (they are in the journal's order, not the keys':
// that would rewrite a random journal page each): once a pass has ended, every record older than
// its start is dead (checkpointed, or followed by a newer record of its key), and the following
// transactions delete them from the journal's front, in order.
//
// The journal is written in the transaction of the batch (with its events, all or nothing) and
// read back into the overlay at Open, the newer record of a key winning (a dead record read so
// holds what the bucket holds, or is followed by a newer one), so what Commit made durable stays
// durable; readers see the overlay over the bucket.

// The event id index (ev_ids: event id → seq) is written the same way, for the same reason: an
// event's id is a hash, so every appended event rewrote a random page of an index holding every
// event kept.

// bDetJournal and bIDJournal: journal seq (8 bytes big-endian) → a change of bDetector or
// bEventIDs (encodeJournal).
var (
	bDetJournal = []byte("detector_journal")
	bIDJournal  = []byte("ev_ids_journal")
)

const (
	// detOverlayMin is the overlay's size below which nothing is checkpointed: a few hundred KiB
	// of memory, and enough keys to share the pages of a small bucket. detOverlayMax bounds the
	// overlay of a large bucket (the id index of a long retention): ~6 MiB.
	detOverlayMin = 4096
	detOverlayMax = 65536
	// detOverlayShare: a checkpoint starts once the overlay holds more than the bucket's keys /
	// detOverlayShare, so that a slice of the overlay's keys in key order finds about
	// (keys per page) / detOverlayShare changes on each leaf page it rewrites (a state is ~150
	// bytes with its key: ~25 a page, ~6 changes a page at 4).
	detOverlayShare = 4
	// detSliceMin is the least a checkpointing transaction moves; it moves at least twice what
	// the transaction journaled too, so a pass ends while changes keep arriving.
	detSliceMin = 256
)

// detEntry is a journaled change: the key's value (del: deleted).
type detEntry struct {
	val []byte
	del bool
}

// detChange is a write transaction's change of the overlay: an entry, or (gone) the key's
// removal once its change is checkpointed.
type detChange struct {
	detEntry
	gone bool
}

// journal is a bucket's journal: the overlay and the checkpoint's progress. over is read under
// mu by anyone; the rest is the writer's (Bolt.writeMu), and over changes only under both.
type journal struct {
	bucket, records []byte // the bucket journaled and the journal's bucket

	mu   sync.RWMutex
	over map[string]detEntry

	// tx is the running write transaction's changes, applied to over once it committed.
	tx      map[string]detChange
	written int // changes journaled in the running transaction
	// moved and dropped are the running transaction's checkpointed keys and deleted dead
	// journal records (CommitTiming).
	moved, dropped int

	// pass is the overlay's keys, sorted, that the running checkpoint pass goes through; at is
	// the next one.
	pass []string
	at   int
	// passFrom is the journal's sequence when the running pass started: once it ends, every
	// record up to it is dead. dead is the newest dead record, front the oldest record kept.
	passFrom, dead, front uint64
	// threshold is the overlay's size that starts a pass: the larger of detOverlayMin and the
	// bucket's keys / detOverlayShare, counted at Open and after every pass.
	threshold int
	// saved is the progress as the running transaction found it, put back if it fails.
	saved journalProgress
}

// journalProgress is what of the checkpoint's progress a transaction changes.
type journalProgress struct {
	dead, front uint64
	threshold   int
}

func newJournal(bucket, records []byte) *journal {
	return &journal{bucket: bucket, records: records, over: map[string]detEntry{}, tx: map[string]detChange{}}
}

// begin starts a write transaction's changes (the writer's, under Bolt.writeMu).
func (j *journal) begin() {
	clear(j.tx)
	j.written, j.moved, j.dropped = 0, 0, 0
	j.saved = journalProgress{j.dead, j.front, j.threshold}
}

// abort forgets the changes of a transaction that failed (it may have failed after its
// checkpoint ran): its journal records and checkpoints were not written, so the front and the
// dead mark go back, and the pass starts again (the overlay still holds every key it had).
func (j *journal) abort() {
	clear(j.tx)
	j.written = 0
	j.dead, j.front, j.threshold = j.saved.dead, j.saved.front, j.saved.threshold
	j.pass, j.at = j.pass[:0], 0
}

// committed applies the committed transaction's changes to the overlay.
func (j *journal) committed() {
	if len(j.tx) == 0 {
		return
	}
	j.mu.Lock()
	for k, c := range j.tx {
		if c.gone {
			delete(j.over, k)
		} else {
			j.over[k] = c.detEntry
		}
	}
	j.mu.Unlock()
	clear(j.tx)
}

// current is the key's journaled change as the running transaction sees it.
func (j *journal) current(key string) (detEntry, bool) {
	if c, ok := j.tx[key]; ok {
		return c.detEntry, !c.gone
	}
	e, ok := j.over[key] // over changes only under the writer's lock, which the caller holds
	return e, ok
}

// set journals a change of key in tx: val, or (val == nil) the key's deletion.
func (j *journal) set(tx *bolt.Tx, key string, val []byte) error {
	// What the bucket would refuse, refused now: at the checkpoint it would fail another batch's
	// transaction.
	switch {
	case key == "":
		return bolterrors.ErrKeyRequired
	case len(key) > bolt.MaxKeySize:
		return bolterrors.ErrKeyTooLarge
	case len(val) > bolt.MaxValueSize:
		return bolterrors.ErrValueTooLarge
	}
	jb := tx.Bucket(j.records)
	seq, err := jb.NextSequence()
	if err != nil {
		return err
	}
	if err := jb.Put(seqKey(seq), encodeJournal(key, val)); err != nil {
		return err
	}
	j.tx[key] = detChange{detEntry: detEntry{val: bytes.Clone(val), del: val == nil}}
	j.written++
	return nil
}

// checkpoint moves a slice of the overlay into the detector bucket in tx, when a pass is running
// or the overlay has grown past its share of the bucket, and deletes dead journal records.
func (j *journal) checkpoint(tx *bolt.Tx) error {
	budget := max(detSliceMin, 2*j.written)
	det, jb := tx.Bucket(j.bucket), tx.Bucket(j.records)
	for n := budget; n > 0 && j.front <= j.dead; n-- {
		if err := jb.Delete(seqKey(j.front)); err != nil {
			return err
		}
		j.front++
		j.dropped++
	}
	if j.at >= len(j.pass) {
		if len(j.over)+len(j.tx) <= j.threshold { // at most that many keys
			return nil
		}
		j.pass = j.pass[:0]
		for k := range j.over {
			j.pass = append(j.pass, k)
		}
		for k, c := range j.tx {
			if _, ok := j.over[k]; !ok && !c.gone {
				j.pass = append(j.pass, k)
			}
		}
		slices.Sort(j.pass)
		j.at, j.passFrom = 0, jb.Sequence()
	}
	for ; budget > 0 && j.at < len(j.pass); j.at++ {
		k := j.pass[j.at]
		e, ok := j.current(k)
		if !ok {
			continue // checkpointed already
		}
		var err error
		if e.del {
			err = det.Delete([]byte(k))
		} else {
			err = det.Put([]byte(k), e.val)
		}
		if err != nil {
			return err
		}
		j.tx[k] = detChange{gone: true}
		j.moved++
		budget--
	}
	if j.at >= len(j.pass) {
		// The pass ended in this transaction: if it fails, dead stays as it was, and the
		// overlay keeps the keys (the next pass takes them again).
		j.pass, j.at, j.dead = j.pass[:0], 0, max(j.dead, j.passFrom)
		j.count(tx)
	}
	return nil
}

// count sets threshold from the detector bucket's keys as tx sees them.
func (j *journal) count(tx *bolt.Tx) {
	j.threshold = min(detOverlayMax, max(detOverlayMin, tx.Bucket(j.bucket).Stats().KeyN/detOverlayShare))
}

// load reads the journal into the overlay (at Open), the newer record of a key winning.
func (j *journal) load(tx *bolt.Tx) error {
	jb := tx.Bucket(j.records)
	j.front = jb.Sequence() + 1
	if k, _ := jb.Cursor().First(); k != nil {
		j.front = binary.BigEndian.Uint64(k)
	}
	j.dead = j.front - 1
	err := jb.ForEach(func(k, v []byte) error {
		key, val, err := decodeJournal(v)
		if err != nil {
			return fmt.Errorf("detector journal record %x: %w", k, err)
		}
		j.over[key] = detEntry{val: val, del: val == nil}
		return nil
	})
	if err != nil {
		return err
	}
	j.count(tx)
	return nil
}

// getTx returns key's value as the running write transaction sees it (nil: none); bbolt's memory
// when it comes from the bucket.
func (j *journal) getTx(tx *bolt.Tx, key string) []byte {
	if e, ok := j.current(key); ok {
		if e.del {
			return nil
		}
		return e.val
	}
	return tx.Bucket(j.bucket).Get([]byte(key))
}

// get returns key's journaled value: found says the overlay has the key (val nil: deleted).
// Outside a write transaction, a reader asks it before it begins its read transaction (a key
// leaves the overlay only once its checkpoint committed, so it then finds it in the bucket).
func (j *journal) get(key string) (val []byte, deleted, found bool) {
	j.mu.RLock()
	e, ok := j.over[key]
	j.mu.RUnlock()
	if !ok {
		return nil, false, false
	}
	return bytes.Clone(e.val), e.del, true
}

// snapshot returns the overlay's entries in key order.
func (j *journal) snapshot() []journaled {
	j.mu.RLock()
	out := make([]journaled, 0, len(j.over))
	for k, e := range j.over {
		out = append(out, journaled{k, e})
	}
	j.mu.RUnlock()
	slices.SortFunc(out, func(a, b journaled) int {
		switch {
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		return 0
	})
	return out
}

type journaled struct {
	key string
	detEntry
}

// len is how many keys the overlay holds (tests).
func (j *journal) len() int {
	j.mu.RLock()
	defer j.mu.RUnlock()
	return len(j.over)
}

// encodeJournal is a journal record: uvarint len(key), key, then 0 (deleted) or 1 and the value.
func encodeJournal(key string, val []byte) []byte {
	b := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen32+len(key)+1+len(val)), uint64(len(key)))
	b = append(b, key...)
	if val == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	return append(b, val...)
}

var errJournalRecord = errors.New("corrupt record")

// decodeJournal reads a journal record (a copy: bbolt memory is only valid in its transaction).
func decodeJournal(rec []byte) (key string, val []byte, err error) {
	n, w := binary.Uvarint(rec)
	// The length as encodeJournal writes it, in its fewest bytes: binary.Uvarint also takes
	// padded forms (0x81 0x00 for 1), which no record written here has, so such a record is
	// corrupt rather than a second spelling of a valid one.
	if w <= 0 || n == 0 || n > uint64(len(rec)-w) || w != (bits.Len64(n)+6)/7 {
		return "", nil, errJournalRecord
	}
	key, rec = string(rec[w:w+int(n)]), rec[w+int(n):]
	switch {
	case len(rec) == 1 && rec[0] == 0:
		return key, nil, nil
	case len(rec) >= 1 && rec[0] == 1:
		return key, append([]byte{}, rec[1:]...), nil
	}
	return "", nil, errJournalRecord
}
