package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// Filter selects records; zero fields match everything.
type Filter struct {
	Machine string    // exact machine name
	Thread  string    // exact thread id
	Since   time.Time // records at or after this time
}

// Match reports whether r passes the filter.
func (f Filter) Match(r Record) bool {
	if f.Machine != "" && r.Machine != f.Machine {
		return false
	}
	if f.Thread != "" && r.Thread != f.Thread {
		return false
	}
	if !f.Since.IsZero() && r.Time.Before(f.Since) {
		return false
	}
	return true
}

// ParseSince reads a --since value: a duration back from now ("90m", "2h",
// "36h") or an RFC 3339 time ("2025-06-01T08:00:00Z").
func ParseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %q: want a positive duration such as 2h, or an RFC 3339 time", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration such as 2h or 30m, or an RFC 3339 time such as 2025-06-01T08:00:00Z", s)
}

// Files lists the log files in dir, oldest first: audit.log.N … audit.log.1,
// audit.log. Missing files are left out.
func Files(dir string) ([]string, error) {
	base := filepath.Join(dir, FileName)
	matches, err := filepath.Glob(base + ".*")
	if err != nil {
		return nil, err
	}
	type numbered struct {
		n    int
		path string
	}
	var rot []numbered
	for _, m := range matches {
		n, err := strconv.Atoi(strings.TrimPrefix(m, base+"."))
		if err != nil || n < 1 {
			continue
		}
		rot = append(rot, numbered{n, m})
	}
	sort.Slice(rot, func(i, j int) bool { return rot[i].n > rot[j].n })
	out := make([]string, 0, len(rot)+1)
	for _, r := range rot {
		out = append(out, r.path)
	}
	if _, err := os.Stat(base); err == nil {
		out = append(out, base)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return out, nil
}

// Scan calls fn, oldest first, with every line of the log files in dir whose
// record matches f (the line without its newline, and the record). Lines that
// do not decode as a record are skipped and counted in bad.
func Scan(dir string, f Filter, fn func(line []byte, r Record) error) (bad int, err error) {
	files, err := Files(dir)
	if err != nil {
		return 0, err
	}
	for _, path := range files {
		b, err := scanFile(path, f, fn)
		bad += b
		if err != nil {
			return bad, err
		}
	}
	return bad, nil
}

// Decode reads one stored line; false when it is not a record.
func Decode(line []byte) (Record, bool) {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil || r.Tool == "" {
		return Record{}, false
	}
	return r, true
}

// Source is a place audit records are read from, oldest first: the files of a state
// directory (FileSource) or the database's table (pgstore.Store.ScanAudit).
type Source func(f Filter, fn func(line []byte, r Record) error) (bad int, err error)

// FileSource reads the log files in dir (Scan).
func FileSource(dir string) Source {
	return func(f Filter, fn func([]byte, Record) error) (int, error) { return Scan(dir, f, fn) }
}

func scanFile(path string, f Filter, fn func([]byte, Record) error) (bad int, err error) {
	file, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) { // rotated away meanwhile
			return 0, nil
		}
		return 0, err
	}
	defer file.Close()
	br := bufio.NewReader(file)
	for {
		line, rerr := br.ReadBytes('\n')
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) > 0 {
			if r, ok := Decode(line); !ok {
				bad++
			} else if f.Match(r) {
				if err := fn(line, r); err != nil {
					return bad, err
				}
			}
		}
		if rerr == io.EOF {
			return bad, nil
		}
		if rerr != nil {
			return bad, fmt.Errorf("%s: %w", path, rerr)
		}
	}
}

// Print writes the matching records of the sources, one source after the other, to w: the JSON
// lines as stored when asJSON, else a table. It returns how many records it printed and how
// many lines it could not read.
func Print(w io.Writer, f Filter, asJSON bool, sources ...Source) (n, bad int, err error) {
	scan := func(fn func([]byte, Record) error) error {
		for _, src := range sources {
			b, err := src(f, fn)
			bad += b
			if err != nil {
				return err
			}
		}
		return nil
	}
	if asJSON {
		bw := bufio.NewWriter(w)
		err = scan(func(line []byte, _ Record) error {
			n++
			if _, err := bw.Write(line); err != nil {
				return err
			}
			return bw.WriteByte('\n')
		})
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
		return n, bad, err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tTOOL\tMACHINE\tPROJECT\tTHREAD\tAPPROVAL\tRESULT\tCLIENT\tORIGIN\tPROMPT")
	err = scan(func(_ []byte, r Record) error {
		n++
		_, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.Time.UTC().Format(time.RFC3339), r.Tool, dash(r.Machine), dash(r.Project), dash(r.Thread),
			dash(r.Approval), resultText(r), dash(clientText(r.Client)), dash(oneLine(r.Origin, 40)), dash(oneLine(r.PromptPrefix, 40)))
		return err
	})
	if ferr := tw.Flush(); err == nil {
		err = ferr
	}
	return n, bad, err
}

func resultText(r Record) string {
	if r.Error != "" {
		return "error: " + oneLine(r.Error, 60)
	}
	return dash(r.Result)
}

func clientText(c Client) string {
	return strings.TrimSpace(c.Name + " " + c.Version)
}

// oneLine flattens s for a table cell and cuts it to n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	return text.Cut(s, n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
