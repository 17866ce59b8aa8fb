package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// firstHole is the offset of the first hole in path at or after off (the file's length when there
// is none), as the filesystem reports it.
func firstHole(t *testing.T, path string, off int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// reportsHoles skips the test where the filesystem does not report a sparse file's hole.
func reportsHoles(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, "sparse")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 1<<20); err != nil {
		t.Fatal(err)
	}
	if firstHole(t, p, 0) != 0 {
		t.Skip("this filesystem does not report holes (SEEK_HOLE)")
	}
	os.Remove(p)
}

// TestHeadroomIsWrittenPastTheMark: as the group's commits grow the file, the bytes past bbolt's
// high-water mark are written (no hole) for headroomAhead; without the headroom bbolt's own growth
// leaves a hole right there. What was committed reads back after a reopen.
func TestHeadroomIsWrittenPastTheMark(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("headroom=%v", on), func(t *testing.T) {
			dir := t.TempDir()
			reportsHoles(t, dir)
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			s.headroom.off = !on
			g := NewGroup(s)
			body := []byte(`{"reply":"` + string(bytes.Repeat([]byte("x"), 2000)) + `"}`)
			const n = 6000 // ~12 MB of bodies: bbolt grows the file several times
			const per = 50 // events a commit: 120 fsynced commits, not 6,000
			for i := 0; i < n; i += per {
				var evs []Event
				for j := i; j < i+per; j++ {
					id := fmt.Sprintf("e%05d", j)
					evs = append(evs, Event{ID: id, Stream: "m/t" + id[len(id)-2:], Body: body, CreatedAt: time.Now()})
				}
				if err := g.Commit(Batch{Events: evs}); err != nil {
					t.Fatal(err)
				}
			}
			for range headroomAhead / headroomStep {
				s.keepHeadroom() // top up: a call writes one step
			}
			mark, err := txSize(s.db)
			if err != nil {
				t.Fatal(err)
			}
			if mark < 8<<20 {
				t.Fatalf("the high-water mark is %d bytes: the commits did not grow the file", mark)
			}
			hole := firstHole(t, s.Path(), mark)
			if on && hole < mark+headroomAhead {
				t.Errorf("a hole at %d, %d bytes past the high-water mark %d; want none within %d", hole, hole-mark, mark, headroomAhead)
			}
			if !on && hole >= mark+headroomAhead {
				t.Errorf("without the headroom no hole within %d bytes of the mark %d (first at %d): this filesystem shows nothing the test can check", headroomAhead, mark, hole)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, err = Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			pending, _, _, err := s.Counts()
			if err != nil {
				t.Fatal(err)
			}
			if pending != n {
				t.Fatalf("%d pending events after the reopen, want %d", pending, n)
			}
			evs, err := s.Pending(n)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range evs {
				if want := fmt.Sprintf("e%05d", i); e.ID != want || !bytes.Equal(e.Body, body) {
					t.Fatalf("event %d: %s with a %d-byte body, want %s with the %d-byte body", i, e.ID, len(e.Body), want, len(body))
				}
			}
		})
	}
}
