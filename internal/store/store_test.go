package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func open(t *testing.T, dir string) *Bolt {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ev(id, stream string) Event {
	return Event{ID: id, Stream: stream, Body: []byte(fmt.Sprintf(`{"id":%q}`, id)), CreatedAt: t0}
}

func ids(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

func TestOpenCreatesPrivateDirAndFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "nested")
	s := open(t, dir)
	if s.Path() != filepath.Join(dir, FileName) {
		t.Fatalf("Path = %s", s.Path())
	}
	di, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Errorf("dir mode = %v, want 0700", di.Mode().Perm())
	}
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode = %v, want 0600", fi.Mode().Perm())
	}
}

func TestOpenUnwritableDir(t *testing.T) {
	t.Run("path is a file", func(t *testing.T) {
		// Works as root too: no permission bit can make a regular file a directory.
		f := filepath.Join(t.TempDir(), "afile")
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Open(filepath.Join(f, "state"))
		if err == nil {
			t.Fatal("Open succeeded under a regular file")
		}
		msg := err.Error()
		if !strings.Contains(msg, "cannot create state directory") || !strings.Contains(msg, "T3CODE_MCP_STATE_DIR") {
			t.Fatalf("unclear error: %v", err)
		}
	})
	t.Run("no write permission", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root ignores directory permission bits")
		}
		dir := filepath.Join(t.TempDir(), "ro")
		if err := os.Mkdir(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
		_, err := Open(dir)
		if err == nil || !strings.Contains(err.Error(), "is not writable") || !errors.Is(err, os.ErrPermission) {
			t.Fatalf("unclear error: %v", err)
		}
	})
	t.Run("empty dir name", func(t *testing.T) {
		if _, err := Open(""); err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_STATE_DIR") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestOpenTwiceIsInUse(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	_, err := Open(dir) // the flock is per open file, so this conflicts within one process too
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("second Open: %v, want ErrInUse", err)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bMeta).Put(kVersion, seqKey(schemaVersion+1)) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "newer t3code-mcp") {
		t.Fatalf("err = %v", err)
	}
}

func TestThreads(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	a := Thread{ID: "th-b", Machine: "mac", ProjectID: "p1", ProjectTitle: "api", Title: "fix it", Origin: "mcp", Watch: true, LastMessageID: "m1", LastRunID: "r1", CreatedAt: t0, UpdatedAt: t0.Add(time.Minute)}
	b := Thread{ID: "th-a", Machine: "box", CreatedAt: t0.Add(time.Hour), UpdatedAt: t0.Add(time.Hour)}
	for _, th := range []Thread{a, b} {
		if err := s.PutThread(th); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutThread(Thread{ID: "x"}); err == nil {
		t.Fatal("a thread without machine was accepted")
	}
	got, ok, err := s.GetThread("th-b")
	if err != nil || !ok || !reflect.DeepEqual(got, a) {
		t.Fatalf("GetThread = %#v %v %v", got, ok, err)
	}
	if _, ok, err := s.GetThread("nope"); ok || err != nil {
		t.Fatalf("GetThread(nope) = %v %v", ok, err)
	}
	a.LastRunID = "r2"
	if err := s.PutThread(a); err != nil {
		t.Fatal(err)
	}

	s.Close()
	s = open(t, dir)
	list, err := s.ListThreads()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(list, []Thread{a, b}) { // oldest first, not id order
		t.Fatalf("ListThreads after reopen = %#v", list)
	}
	if err := s.DeleteThread("th-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteThread("th-b"); err != nil {
		t.Fatal("deleting twice:", err)
	}
	if list, _ := s.ListThreads(); len(list) != 1 || list[0].ID != "th-a" {
		t.Fatalf("after delete: %#v", list)
	}
}

func TestCommitDetectorAndEventsTogether(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	th := Thread{ID: "t1", Machine: "mac", LastRunID: "r1", CreatedAt: t0, UpdatedAt: t0}
	err := s.Commit(Batch{
		Detector: map[string][]byte{"mac\x00t1": []byte(`{"run":"r1"}`), "mac\x00t2": []byte("x")},
		Events:   []Event{ev("e1", "mac/t1"), ev("e2", "mac/t1")},
		Threads:  []Thread{th},
	})
	if err != nil {
		t.Fatal(err)
	}
	// A nil value deletes; an invalid event fails the whole batch.
	err = s.Commit(Batch{
		Detector: map[string][]byte{"mac\x00t1": []byte("CHANGED")},
		Events:   []Event{ev("e3", "mac/t1"), {ID: "bad", Stream: "mac/t1", Body: []byte("{not json")}},
	})
	if err == nil {
		t.Fatal("invalid body accepted")
	}
	if err := s.Commit(Batch{Detector: map[string][]byte{"mac\x00t2": nil}}); err != nil {
		t.Fatal(err)
	}

	s.Close()
	s = open(t, dir)
	v, ok, err := s.Detector("mac\x00t1")
	if err != nil || !ok || string(v) != `{"run":"r1"}` {
		t.Fatalf("Detector = %q %v %v (the failed batch must not have been applied)", v, ok, err)
	}
	if _, ok, _ := s.Detector("mac\x00t2"); ok {
		t.Fatal("nil value did not delete")
	}
	if _, ok, _ := s.Detector("none"); ok {
		t.Fatal("unknown key found")
	}
	if got, _, _ := s.GetThread("t1"); got.LastRunID != "r1" {
		t.Fatalf("thread in batch: %#v", got)
	}
	p, err := s.Pending(0)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ids(p), []string{"e1", "e2"}) {
		t.Fatalf("pending = %v", ids(p))
	}
	e := p[0]
	if e.State != StatePending || !e.CreatedAt.Equal(t0) || !e.EnqueuedAt.Equal(t0) || string(e.Body) != `{"id":"e1"}` || e.Attempts != 0 {
		t.Fatalf("event = %#v", e)
	}
}

func TestCommitValidation(t *testing.T) {
	s := open(t, t.TempDir())
	for _, e := range []Event{
		{Stream: "s", Body: []byte("{}")},
		{ID: "a", Body: []byte("{}")},
		{ID: "a", Stream: "s\x00x", Body: []byte("{}")},
		{ID: "a", Stream: "s", Body: nil},
	} {
		if err := s.Commit(Batch{Events: []Event{e}}); err == nil {
			t.Errorf("accepted %#v", e)
		}
	}
}

func TestCommitFillsCreatedAt(t *testing.T) {
	s := open(t, t.TempDir())
	before := time.Now()
	if err := s.Commit(Batch{Events: []Event{{ID: "a", Stream: "s", Body: []byte("{}")}}}); err != nil {
		t.Fatal(err)
	}
	e, err := s.Get("a")
	if err != nil || e.CreatedAt.Before(before) || !e.EnqueuedAt.Equal(e.CreatedAt) {
		t.Fatalf("Get = %#v %v", e, err)
	}
}

func TestDuplicateEventIgnored(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.Commit(Batch{Events: []Event{ev("e1", "a"), ev("e1", "a")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivered("e1", t0); err != nil {
		t.Fatal(err)
	}
	// Replaying the same batch after delivery must not queue it again.
	dup := ev("e1", "a")
	dup.Body = []byte(`{"different":true}`)
	if err := s.Commit(Batch{Events: []Event{dup, ev("e2", "a")}}); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Pending(0)
	if !reflect.DeepEqual(ids(p), []string{"e2"}) {
		t.Fatalf("pending = %v", ids(p))
	}
	got, _ := s.Get("e1")
	if got.State != StateDelivered || string(got.Body) != `{"id":"e1"}` {
		t.Fatalf("e1 = %#v", got)
	}
}

func TestHeadsPerStreamFIFO(t *testing.T) {
	s := open(t, t.TempDir())
	// Interleaved streams, including one whose name is a prefix of another.
	batch := []Event{ev("a1", "m/a"), ev("b1", "m/b"), ev("a2", "m/a"), ev("ab1", "m/ab"), ev("b2", "m/b"), ev("a3", "m/a")}
	if err := s.Commit(Batch{Events: batch}); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Pending(0)
	if !reflect.DeepEqual(ids(p), []string{"a1", "b1", "a2", "ab1", "b2", "a3"}) {
		t.Fatalf("pending = %v", ids(p))
	}
	for i := 1; i < len(p); i++ {
		if p[i].Seq <= p[i-1].Seq {
			t.Fatalf("seq not increasing: %v", p)
		}
	}
	if p3, _ := s.Pending(3); len(p3) != 3 {
		t.Fatalf("Pending(3) = %d", len(p3))
	}
	check := func(want ...string) {
		t.Helper()
		h, err := s.Heads(0)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ids(h), want) && !(len(h) == 0 && len(want) == 0) {
			t.Fatalf("heads = %v, want %v", ids(h), want)
		}
	}
	check("a1", "ab1", "b1")
	if h, _ := s.Heads(2); !reflect.DeepEqual(ids(h), []string{"a1", "ab1"}) {
		t.Fatalf("Heads(2) = %v", ids(h))
	}
	if err := s.MarkRetry("a1", t0.Add(time.Minute), "receiver: HTTP 500"); err != nil {
		t.Fatal(err)
	}
	check("a1", "ab1", "b1") // a retry keeps the head
	if err := s.MarkDelivered("a1", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDead("b1", t0, "receiver: HTTP 400"); err != nil {
		t.Fatal(err)
	}
	check("a2", "ab1", "b2")
	for _, id := range []string{"a2", "a3", "ab1", "b2"} {
		if err := s.MarkDelivered(id, t0); err != nil {
			t.Fatal(err)
		}
	}
	check()
}

func TestMarks(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Commit(Batch{Events: []Event{ev("e1", "s"), ev("e2", "s")}}); err != nil {
		t.Fatal(err)
	}
	next := t0.Add(30 * time.Second)
	if err := s.MarkRetry("e1", next, "network: connection refused"); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkRetry("e1", next.Add(time.Second), "receiver: HTTP 503"); err != nil {
		t.Fatal(err)
	}
	e, _ := s.Get("e1")
	if e.Attempts != 2 || !e.NextAttempt.Equal(next.Add(time.Second)) || e.LastError != "receiver: HTTP 503" || e.State != StatePending {
		t.Fatalf("after retries: %#v", e)
	}
	at := t0.Add(time.Minute)
	if err := s.MarkDelivered("e1", at); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDead("e2", at, "receiver: HTTP 400"); err != nil {
		t.Fatal(err)
	}
	// Marks apply only to pending events.
	for _, err := range []error{s.MarkDelivered("e1", at), s.MarkRetry("e2", at, "x"), s.MarkDead("e1", at, "x")} {
		if !errors.Is(err, ErrNotPending) {
			t.Fatalf("mark of a finished event: %v", err)
		}
	}
	if err := s.MarkDelivered("nope", at); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}

	s.Close()
	s = open(t, dir)
	e, _ = s.Get("e1")
	if e.State != StateDelivered || e.Attempts != 3 || !e.DeliveredAt.Equal(at) || !e.NextAttempt.IsZero() {
		t.Fatalf("delivered after reopen: %#v", e)
	}
	d, _ := s.Dead()
	if len(d) != 1 || d[0].ID != "e2" || d[0].LastError != "receiver: HTTP 400" || !d[0].DeadAt.Equal(at) || d[0].Attempts != 1 {
		t.Fatalf("dead after reopen: %#v", d)
	}
	if p, dd, dl, err := s.Counts(); p != 0 || dd != 1 || dl != 1 || err != nil {
		t.Fatalf("Counts = %d %d %d %v", p, dd, dl, err)
	}
}

func TestRequeue(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.Commit(Batch{Events: []Event{ev("d1", "s"), ev("d2", "s"), ev("p3", "s"), ev("x", "o")}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"d1", "d2"} {
		if err := s.MarkDead(id, t0, "receiver: HTTP 400"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkDelivered("x", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Requeue(t0, "d1", "missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if d, _ := s.Dead(); len(d) != 2 {
		t.Fatal("a failed Requeue changed something")
	}
	at := t0.Add(48 * time.Hour)
	n, err := s.Requeue(at, "d2", "d2", "x") // duplicates and non-dead ids are skipped
	if err != nil || n != 1 {
		t.Fatalf("Requeue = %d %v", n, err)
	}
	e, _ := s.Get("d2")
	if e.State != StatePending || !e.EnqueuedAt.Equal(at) || e.Attempts != 0 || !e.DeadAt.IsZero() || e.LastError == "" {
		t.Fatalf("requeued: %#v", e)
	}
	// The requeued event is its stream's head again, ahead of p3.
	if h, _ := s.Heads(0); !reflect.DeepEqual(ids(h), []string{"d2"}) {
		t.Fatalf("heads = %v", ids(h))
	}
	n, err = s.Requeue(at) // all dead
	if err != nil || n != 1 {
		t.Fatalf("Requeue(all) = %d %v", n, err)
	}
	if p, _ := s.Pending(0); !reflect.DeepEqual(ids(p), []string{"d1", "d2", "p3"}) {
		t.Fatalf("pending = %v", ids(p))
	}
	if n, err := s.Requeue(at); n != 0 || err != nil {
		t.Fatalf("nothing dead: %d %v", n, err)
	}
}

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	var batch []Event
	for i := range 50 {
		batch = append(batch, ev(fmt.Sprintf("e%02d", i), fmt.Sprintf("s%d", i%3)))
	}
	if err := s.Commit(Batch{Events: batch}); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		// Consecutive keys to delete, to catch a cursor skipping over deleted keys.
		if err := s.MarkDelivered(fmt.Sprintf("e%02d", i), t0.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkDead("e45", t0, "gone"); err != nil {
		t.Fatal(err)
	}
	n, err := s.Prune(t0.Add(30 * time.Minute))
	if err != nil || n != 30 {
		t.Fatalf("Prune = %d %v", n, err)
	}
	p, d, dl, _ := s.Counts()
	if p != 9 || d != 1 || dl != 10 {
		t.Fatalf("Counts = %d %d %d", p, d, dl)
	}
	if _, err := s.Get("e00"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pruned event still found: %v", err)
	}
	if e, err := s.Get("e35"); err != nil || e.State != StateDelivered {
		t.Fatalf("recent delivered event: %#v %v", e, err)
	}
	n, _ = s.Prune(t0.Add(24 * time.Hour))
	if n != 10 {
		t.Fatalf("second Prune = %d", n)
	}
	s.Close()
	s = open(t, dir)
	if p, d, dl, _ := s.Counts(); p != 9 || d != 1 || dl != 0 {
		t.Fatalf("Counts after reopen = %d %d %d", p, d, dl)
	}
}

func TestPersistenceAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Commit(Batch{Events: []Event{ev("e1", "s"), ev("e2", "s")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	// Sequences continue after a reopen, so new events still sort after old ones.
	if err := s.Commit(Batch{Events: []Event{ev("e3", "s")}}); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Pending(0)
	if !reflect.DeepEqual(ids(p), []string{"e1", "e2", "e3"}) || p[2].Seq <= p[1].Seq {
		t.Fatalf("pending after reopen = %v", p)
	}
	var body map[string]string
	if err := json.Unmarshal(p[0].Body, &body); err != nil || body["id"] != "e1" {
		t.Fatalf("body = %s", p[0].Body)
	}
}

func TestConcurrentCommits(t *testing.T) {
	s := open(t, t.TempDir())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				stream := fmt.Sprintf("m/%d", w)
				if err := s.Commit(Batch{Events: []Event{ev(fmt.Sprintf("%d-%02d", w, i), stream)}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	p, _ := s.Pending(0)
	if len(p) != 80 {
		t.Fatalf("pending = %d", len(p))
	}
	last := map[string]string{}
	for _, e := range p {
		if e.ID <= last[e.Stream] {
			t.Fatalf("stream %s out of order: %s after %s", e.Stream, e.ID, last[e.Stream])
		}
		last[e.Stream] = e.ID
	}
}

// An empty detector key is refused before any transaction: inside a group
// commit bbolt would fail the whole shared transaction for it (every other
// caller's batch then written again alone).
func TestCommitRefusesEmptyDetectorKey(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(s)
	for _, v := range [][]byte{[]byte(`{"run":"r1"}`), nil} {
		b := Batch{Detector: map[string][]byte{"": v, "mac\x00t1": []byte(`{}`)}}
		if err := s.Commit(b); err == nil || !strings.Contains(err.Error(), "detector state needs a key") {
			t.Fatalf("Commit with an empty key (value %q) = %v", v, err)
		}
		if err := g.Commit(b); err == nil || !strings.Contains(err.Error(), "detector state needs a key") {
			t.Fatalf("Group.Commit with an empty key (value %q) = %v", v, err)
		}
	}
	if txs, _ := g.Stats(); txs != 0 {
		t.Fatalf("the group wrote %d transactions for batches it should have refused", txs)
	}
	if _, ok, _ := s.Detector("mac\x00t1"); ok {
		t.Fatal("part of a refused batch was written")
	}
}

// GetThreads reads many threads at once: tracked ones by id, untracked ones absent.
func TestGetThreads(t *testing.T) {
	s := open(t, t.TempDir())
	a := Thread{ID: "a", Machine: "mac", Watch: true, CreatedAt: t0, UpdatedAt: t0}
	b := Thread{ID: "b", Machine: "box", CreatedAt: t0, UpdatedAt: t0}
	for _, th := range []Thread{a, b} {
		if err := s.PutThread(th); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.GetThreads([]string{"a", "nope", "b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, map[string]Thread{"a": a, "b": b}) {
		t.Fatalf("GetThreads = %#v", got)
	}
	if got, err := s.GetThreads(nil); err != nil || len(got) != 0 {
		t.Fatalf("GetThreads(nil) = %#v, %v", got, err)
	}
}
