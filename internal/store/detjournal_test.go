package store

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// detModel checks the store's detector state against the model: Detector for every key and
// ForEachDetector in key order.
func detModel(t *testing.T, s *Bolt, model map[string]string) {
	t.Helper()
	for k, want := range model {
		v, ok, err := s.Detector(k)
		if err != nil || ok != (want != "") || string(v) != want {
			t.Fatalf("Detector(%q) = %q %v %v, want %q", k, v, ok, err, want)
		}
	}
	got := map[string]string{}
	last := ""
	if err := s.ForEachDetector(func(k string, v []byte) error {
		if k <= last && last != "" {
			return fmt.Errorf("key %q after %q: not in key order", k, last)
		}
		last = k
		got[k] = string(v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for k, v := range model {
		if v != "" {
			want[k] = v
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("ForEachDetector: %d keys, want %d (first differences: %v)", len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(got, want map[string]string) []string {
	var out []string
	for k, v := range want {
		if got[k] != v && len(out) < 3 {
			out = append(out, fmt.Sprintf("%q: got %q want %q", k, got[k], v))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok && len(out) < 6 {
			out = append(out, fmt.Sprintf("%q: got %q, not wanted", k, v))
		}
	}
	return out
}

// journalRecords counts the journal's records.
func journalRecords(t *testing.T, s *Bolt) int {
	t.Helper()
	n := 0
	if err := s.db.View(func(tx *bolt.Tx) error { n = tx.Bucket(bDetJournal).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDetectorJournalCheckpointsAndReopens writes, rewrites and deletes many detector states, as
// a busy detector does, through enough commits that checkpoint passes run and the journal's dead
// records are deleted; every state reads back as last written (Detector, ForEachDetector) all
// along, after reopening the file, and after the overlay was checkpointed away.
func TestDetectorJournalCheckpointsAndReopens(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	model := map[string]string{}
	rng := rand.New(rand.NewPCG(1, 2))
	const keys = 3 * detOverlayMin
	commit := func(n int) {
		det := map[string][]byte{}
		for range n {
			k := fmt.Sprintf("m%02d\x00thread-%05d", rng.IntN(10), rng.IntN(keys/10))
			if rng.IntN(10) == 0 {
				det[k] = nil
				model[k] = ""
				continue
			}
			v := "state-" + strconv.Itoa(rng.IntN(1_000_000))
			det[k] = []byte(v)
			model[k] = v
		}
		if err := s.Commit(Batch{Detector: det}); err != nil {
			t.Fatal(err)
		}
	}
	for range 40 {
		commit(500)
	}
	detModel(t, s, model)
	peak := s.det.len()
	if peak > detOverlayMin+2*500 {
		t.Fatalf("the overlay holds %d keys after 20,000 writes: no checkpoint ran", peak)
	}
	for range 200 {
		commit(50)
	}
	detModel(t, s, model)
	if n := journalRecords(t, s); n > 2*keys {
		t.Fatalf("the journal holds %d records for %d keys: its dead records are not deleted", n, keys)
	}

	noErr(t, s.Close())
	s = open(t, dir)
	detModel(t, s, model)
	if s.det.len() == 0 {
		t.Fatal("reopened with an empty overlay: the test no longer covers reading the journal back")
	}
	// Rewrite every key once more and let the checkpoints run down the overlay: the bucket alone
	// must then hold the model.
	for range 100 {
		commit(200)
	}
	detModel(t, s, model)
	noErr(t, s.Close())
	s = open(t, dir)
	detModel(t, s, model)
}

// TestDetectorJournalFailedTransactionLeavesNoTrace: a batch that fails inside its transaction
// (a key the bucket refuses, after a good one) changes no state, in memory or on disk.
func TestDetectorJournalFailedTransactionLeavesNoTrace(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	noErr(t, s.Commit(Batch{Detector: map[string][]byte{"m\x00a": []byte("one")}}))
	err := s.CommitBatches([]Batch{
		{Detector: map[string][]byte{"m\x00a": []byte("two"), "m\x00b": []byte("new")}},
		{Detector: map[string][]byte{strings.Repeat("k", bolt.MaxKeySize+1): []byte("x")}},
	})
	if err == nil {
		t.Fatal("a batch with a too large key was written")
	}
	model := map[string]string{"m\x00a": "one", "m\x00b": ""}
	detModel(t, s, model)
	noErr(t, s.Close())
	s = open(t, dir)
	detModel(t, s, model)
}

// TestDetectorJournalReadersNeverGoBack: while one writer moves every key's state forward (and
// the checkpoints move the overlay into the bucket), readers never see a key's state older than
// one they saw before (the overlay is read before the bucket, and loses a key only after its
// checkpoint committed).
func TestDetectorJournalReadersNeverGoBack(t *testing.T) {
	s := open(t, t.TempDir())
	const keys = 2 * detOverlayMin
	key := func(i int) string { return fmt.Sprintf("m\x00t%05d", i) }
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 3)
	for r := range 2 {
		wg.Go(func() {
			seen := make([]int, keys)
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := rng.IntN(keys)
				v, ok, err := s.Detector(key(i))
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					continue // not written yet
				}
				n, _ := strconv.Atoi(string(v))
				if n < seen[i] {
					errs <- fmt.Errorf("key %d went back from %d to %d", i, seen[i], n)
					return
				}
				seen[i] = n
			}
		})
	}
	for round := 1; round <= 8; round++ {
		for from := 0; from < keys; from += 512 {
			det := map[string][]byte{}
			for i := from; i < from+512; i++ {
				det[key(i)] = []byte(strconv.Itoa(round))
			}
			if err := s.Commit(Batch{Detector: det}); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	model := map[string]string{}
	for i := range keys {
		model[key(i)] = "8"
	}
	detModel(t, s, model)
}

func FuzzDecodeJournal(f *testing.F) {
	f.Add(encodeJournal("m\x00t", []byte(`{"run":"r1","settled":true}`)))
	f.Add(encodeJournal("k", nil))
	f.Add(encodeJournal("k", []byte{}))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, rec []byte) {
		key, val, err := decodeJournal(rec)
		if err != nil {
			return
		}
		// What decodes encodes back to the same record.
		if got := encodeJournal(key, val); string(got) != string(rec) {
			t.Fatalf("decode(%x) = %q %q, which encodes to %x", rec, key, val, got)
		}
	})
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestEventIDJournal: the event id index is journaled too. Across enough events that
// checkpoint passes run (and after reopening the file), an id already stored is skipped however
// long ago it was appended, every event is found by id (Get, Record), and a pruned id is new
// again.
func TestEventIDJournal(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	const n = 3 * detOverlayMin
	id := func(i int) string { return fmt.Sprintf("evt_%08x", uint32(i)*2654435761) } // hash-like order
	for from := 0; from < n; from += 256 {
		var evs []Event
		for i := from; i < from+256; i++ {
			evs = append(evs, ev(id(i), fmt.Sprintf("m/t%d", i%100)))
		}
		noErr(t, s.Commit(Batch{Events: evs}))
	}
	if s.ids.len() > detOverlayMin+512 {
		t.Fatalf("the id overlay holds %d ids: no checkpoint ran", s.ids.len())
	}
	check := func() {
		t.Helper()
		// Every id again, in one batch with a new one: only the new one is appended.
		var again []Event
		for i := range n {
			again = append(again, ev(id(i), "m/again"))
		}
		before, _, _, _ := s.Counts()
		noErr(t, s.Commit(Batch{Events: append(again, ev("evt_new_"+strconv.Itoa(before), "m/new"))}))
		if after, _, _, _ := s.Counts(); after != before+1 {
			t.Fatalf("pending %d → %d: stored ids were appended again", before, after)
		}
		for _, i := range []int{0, 1, n / 2, n - 1} {
			e, err := s.Get(id(i))
			if err != nil || e.Stream != fmt.Sprintf("m/t%d", i%100) {
				t.Fatalf("Get(%s) = %+v %v", id(i), e, err)
			}
		}
	}
	check()
	noErr(t, s.Close())
	s = open(t, dir)
	check()
	// Deliver the first half, prune it: those ids are new again; the rest still are not.
	var ops []Op
	for i := range n / 2 {
		ops = append(ops, Op{ID: id(i), Kind: OpDelivered, At: t0})
	}
	errs, err := s.Record(ops)
	noErr(t, err)
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Record %s: %v", ops[i].ID, e)
		}
	}
	if pruned, err := s.Prune(t0.Add(time.Second)); err != nil || pruned != n/2 {
		t.Fatalf("Prune = %d %v, want %d", pruned, err, n/2)
	}
	noErr(t, s.Close())
	s = open(t, dir)
	if _, err := s.Get(id(0)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(pruned) = %v, want ErrNotFound", err)
	}
	before, _, _, _ := s.Counts()
	noErr(t, s.Commit(Batch{Events: []Event{ev(id(0), "m/back"), ev(id(n-1), "m/dup")}}))
	if after, _, _, _ := s.Counts(); after != before+1 {
		t.Fatalf("pending %d → %d: want the pruned id appended again and the kept one skipped", before, after)
	}
	if e, err := s.Get(id(0)); err != nil || e.Stream != "m/back" {
		t.Fatalf("Get(re-added) = %+v %v", e, err)
	}
}

// TestDetectorJournalTransactionFailingAfterItsCheckpoint: a transaction that ends a checkpoint
// pass and then fails (its commit: a full disk) neither moved the states nor made their journal
// records dead, so the following transactions must not delete them: every state survives a
// reopen.
func TestDetectorJournalTransactionFailingAfterItsCheckpoint(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	model := map[string]string{}
	det := map[string][]byte{}
	for i := range 2 * detOverlayMin {
		k := fmt.Sprintf("m\x00t%05d", i)
		det[k] = []byte("v1")
		model[k] = "v1"
	}
	// Journaled in a transaction that checkpoints nothing (the overlay was empty when it began).
	s.writeMu.Lock()
	s.det.begin()
	err := s.db.Update(func(tx *bolt.Tx) error {
		for k, v := range det {
			if err := s.det.set(tx, k, v); err != nil {
				return err
			}
		}
		return nil
	})
	noErr(t, err)
	s.det.committed()
	// A transaction that runs the whole pass, then fails.
	s.det.begin()
	boom := errors.New("commit failed")
	err = s.db.Update(func(tx *bolt.Tx) error {
		for {
			if err := s.det.checkpoint(tx); err != nil {
				return err
			}
			if len(s.det.pass) == 0 {
				return boom
			}
		}
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update = %v", err)
	}
	s.det.abort()
	s.writeMu.Unlock()
	// Later transactions (each deleting what it believes dead) and a reopen.
	for i := range 20 {
		noErr(t, s.Commit(Batch{Detector: map[string][]byte{fmt.Sprintf("x\x00%d", i): []byte("x")}}))
		model[fmt.Sprintf("x\x00%d", i)] = "x"
	}
	noErr(t, s.Close())
	s = open(t, dir)
	detModel(t, s, model)
}
