package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func open(t *testing.T, dir string, o Options) *Log {
	t.Helper()
	l, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func write(t *testing.T, l *Log, r Record) {
	t.Helper()
	if err := l.Write(r); err != nil {
		t.Fatal(err)
	}
}

func all(t *testing.T, dir string, f Filter) []Record {
	t.Helper()
	var out []Record
	bad, err := Scan(dir, f, func(_ []byte, r Record) error {
		out = append(out, r)
		return nil
	})
	if err != nil || bad != 0 {
		t.Fatalf("scan: %v, %d bad lines", err, bad)
	}
	return out
}

func TestWriteAndFilter(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	t0 := time.Date(2025, 6, 1, 8, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	write(t, l, Record{Time: t0, Tool: "t3_dispatch", Machine: "mac", Thread: "th-1", Approval: Accepted, Result: ResultOK})
	write(t, l, Record{Time: t0.Add(time.Hour), Tool: "t3_interrupt", Machine: "mac", Thread: "th-2", Run: "run-1", Approval: NotRequired, Result: ResultOK})
	write(t, l, Record{Time: t0.Add(2 * time.Hour), Tool: "t3_answer", Machine: "pc", Thread: "th-1", Approval: Declined, Result: ResultError, Error: "declined"})

	if st, err := os.Stat(filepath.Join(dir, FileName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("log file: %v %v", st, err)
	}
	got := all(t, dir, Filter{})
	if len(got) != 3 || got[0].Time.Location() != time.UTC || !got[0].Time.Equal(t0) || got[1].Run != "run-1" {
		t.Fatalf("records = %+v", got)
	}
	for _, tc := range []struct {
		f    Filter
		want []string
	}{
		{Filter{Machine: "mac"}, []string{"t3_dispatch", "t3_interrupt"}},
		{Filter{Thread: "th-1"}, []string{"t3_dispatch", "t3_answer"}},
		{Filter{Machine: "mac", Thread: "th-1"}, []string{"t3_dispatch"}},
		{Filter{Since: t0.Add(time.Hour)}, []string{"t3_interrupt", "t3_answer"}},
		{Filter{Machine: "nope"}, nil},
	} {
		var tools []string
		for _, r := range all(t, dir, tc.f) {
			tools = append(tools, r.Tool)
		}
		if !slices.Equal(tools, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.f, tools, tc.want)
		}
	}
}

func TestSetPromptKeepsOnlyHashAndPrefix(t *testing.T) {
	prompt := strings.Repeat("é", 100) + " secret tail"
	var r Record
	r.SetPrompt(prompt)
	sum := sha256.Sum256([]byte(prompt))
	if r.PromptSHA256 != hex.EncodeToString(sum[:]) || r.PromptChars != 112 || r.PromptPrefix != strings.Repeat("é", PromptPrefixChars)+"…" {
		t.Fatalf("record = %+v", r)
	}
	b, _ := json.Marshal(r)
	if strings.Contains(string(b), "secret tail") {
		t.Fatal("the line holds the whole prompt")
	}
	r.SetPrompt("short")
	if r.PromptPrefix != "short" || r.PromptChars != 5 {
		t.Fatalf("short prompt = %+v", r)
	}
}

// Rotation: a line never takes a file past MaxBytes (unless it is longer on
// its own), audit.log.1 is the newest rotated file, and only Keep are kept.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{MaxBytes: 1000, Keep: 2})
	line := func(i int) Record {
		return Record{Tool: "t3_dispatch", Machine: "mac", Thread: fmt.Sprintf("th-%03d", i), Approval: NotRequired, Result: ResultOK, Error: strings.Repeat("x", 100)}
	}
	for i := range 40 {
		write(t, l, line(i))
	}
	files, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, FileName)
	if !slices.Equal(files, []string{base + ".2", base + ".1", base}) {
		t.Fatalf("files = %v", files)
	}
	for _, f := range files {
		st, _ := os.Stat(f)
		if st.Size() > 1000 {
			t.Fatalf("%s has %d bytes", f, st.Size())
		}
	}
	got := all(t, dir, Filter{})
	// Oldest first, contiguous, ending with the last line written.
	if len(got) == 0 || len(got) >= 40 || got[len(got)-1].Thread != "th-039" {
		t.Fatalf("%d records kept, last %+v", len(got), got[len(got)-1])
	}
	first := 40 - len(got)
	for i, r := range got {
		if r.Thread != fmt.Sprintf("th-%03d", first+i) {
			t.Fatalf("record %d is %s, want th-%03d", i, r.Thread, first+i)
		}
	}

	// A reopened log continues the current file and counts its size: the
	// bound still holds.
	l.Close()
	l2 := open(t, dir, Options{MaxBytes: 1000, Keep: 2})
	for i := 40; i < 50; i++ {
		write(t, l2, line(i))
	}
	for _, f := range files {
		if st, _ := os.Stat(f); st.Size() > 1000 {
			t.Fatalf("after reopen: %s has %d bytes", f, st.Size())
		}
	}
	if got := all(t, dir, Filter{}); got[len(got)-1].Thread != "th-049" {
		t.Fatalf("after reopen: last = %+v", got[len(got)-1])
	}
}

// Concurrent writers never tear or interleave lines.
func TestConcurrentWritesAreWholeLines(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{MaxBytes: 1 << 30})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 50 {
				if err := l.Write(Record{Tool: "t3_answer", Machine: fmt.Sprintf("m%d", w), Thread: fmt.Sprint(i), Error: strings.Repeat("e", 500), Approval: Failed, Result: ResultError}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := len(all(t, dir, Filter{})); n != 400 {
		t.Fatalf("%d whole lines, want 400", n)
	}
}

func TestWriteAfterCloseFails(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	l.Close()
	if err := l.Write(Record{Tool: "t3_dispatch"}); err == nil {
		t.Fatal("write after close succeeded")
	}
}

func TestScanSkipsBadLinesAndMissingLog(t *testing.T) {
	dir := t.TempDir()
	if got := all(t, dir, Filter{}); len(got) != 0 {
		t.Fatalf("no log: %v", got)
	}
	l := open(t, dir, Options{})
	write(t, l, Record{Tool: "t3_dispatch", Machine: "mac"})
	f, _ := os.OpenFile(filepath.Join(dir, FileName), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("not json\n{\"no\":\"tool\"}\n\n")
	f.Close()
	write(t, l, Record{Tool: "t3_answer", Machine: "mac"})
	n := 0
	bad, err := Scan(dir, Filter{}, func([]byte, Record) error { n++; return nil })
	if err != nil || bad != 2 || n != 2 {
		t.Fatalf("scan: %d records, %d bad, %v", n, bad, err)
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2h":                        now.Add(-2 * time.Hour),
		"90m":                       now.Add(-90 * time.Minute),
		"2025-05-31T08:00:00Z":      time.Date(2025, 5, 31, 8, 0, 0, 0, time.UTC),
		"2025-05-31T10:00:00+02:00": time.Date(2025, 5, 31, 8, 0, 0, 0, time.UTC),
	} {
		got, err := ParseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "yesterday", "-2h", "2025-05-31"} {
		if _, err := ParseSince(bad, now); err == nil || !strings.Contains(err.Error(), "--since") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestPrint(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	t0 := time.Date(2025, 6, 1, 8, 0, 0, 0, time.UTC)
	write(t, l, Record{Time: t0, Tool: "t3_dispatch", Machine: "mac", Project: "api", Thread: "th-1", Origin: "chat\nwith newline", Client: Client{Name: "claude-code", Version: "2.1"},
		Approval: Accepted, Result: ResultOK, PromptPrefix: "Rewrite the\nchangelog"})
	write(t, l, Record{Time: t0.Add(time.Minute), Tool: "t3_interrupt", Machine: "pc", Thread: "th-2", Approval: Declined, Result: ResultError, Error: "t3_interrupt: the person declined"})

	var b bytes.Buffer
	n, bad, err := Print(&b, Filter{}, false, FileSource(dir))
	if err != nil || n != 2 || bad != 0 {
		t.Fatalf("print: %d %d %v", n, bad, err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("table:\n%s", b.String())
	}
	for _, w := range []string{"2025-06-01T08:00:00Z", "t3_dispatch", "mac", "api", "th-1", "accepted", "ok", "claude-code 2.1", "chat with newline", "Rewrite the changelog"} {
		if !strings.Contains(lines[1], w) {
			t.Errorf("row 1 lacks %q: %s", w, lines[1])
		}
	}
	if !strings.Contains(lines[2], "declined") || !strings.Contains(lines[2], "error: t3_interrupt: the person declined") {
		t.Errorf("row 2: %s", lines[2])
	}

	b.Reset()
	n, _, err = Print(&b, Filter{Machine: "pc"}, true, FileSource(dir))
	if err != nil || n != 1 {
		t.Fatalf("json: %d %v", n, err)
	}
	var r Record
	if err := json.Unmarshal(b.Bytes(), &r); err != nil || r.Tool != "t3_interrupt" || strings.Count(b.String(), "\n") != 1 {
		t.Fatalf("json output %q: %v", b.String(), err)
	}
}
