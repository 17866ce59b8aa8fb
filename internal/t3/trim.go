package t3

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
)

// Keep says which part of a bounded thread read (GET …/threads/{id}/bounded)
// a caller needs. T3's bounded body windows only the timeline rows: it
// carries every run, message, checkpoint and runtime request of the thread,
// so it grows with the thread's history (1.6 MiB at 5,000 turn items, 16 MiB
// at 50,000). A read with a Keep decodes only the runs the caller names and
// what belongs to them; the rest is skipped without being decoded.
//
// What is kept: the newest Runs runs by ordinal, the runs named in RunIDs,
// the runs T3 made of the user messages in MessageIDs; the messages and
// checkpoints of the kept runs (and those the kept runs point at); the
// runtime requests in RequestIDs and every pending one; every timeline row
// and the thread itself, as T3 sent them.
type Keep struct {
	Runs       int // the newest runs by ordinal; at least 1
	RunIDs     []string
	MessageIDs []string
	RequestIDs []string
}

var errShape = errors.New("bounded body: not the shape of a bounded thread snapshot")

// trimBounded rewrites a bounded thread body to the part k keeps, in the
// same shape (a BoundedThreadSnapshot, keys in T3's order, kept elements byte
// for byte as T3 sent them), and returns how many runs the thread has in all.
// Nothing skipped is decoded: a small scanner jumps over values (over strings
// with bytes.IndexByte, where nearly all of a thread's bytes are) and looks
// only at the keys that decide (ids, ordinal, status). An error means body
// is not a JSON object of that shape; the caller then decodes the body as it
// came and reports what is wrong with it.
func trimBounded(body []byte, k Keep) (out []byte, runs int, err error) {
	t := trimmer{k: k}
	s := scanner{b: body}
	out = make([]byte, 0, 4096)
	out = append(out, '{')
	first := true
	err = s.obj(func(key []byte) error {
		start := s.i
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(append(append(out, '"'), key...), '"', ':')
		if string(key) != "projection" {
			if err := s.skip(); err != nil {
				return err
			}
			out = append(out, body[start:s.i]...)
			return nil
		}
		var err error
		out, err = t.projection(out, &s)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	if s.ws(); s.i != len(body) {
		return nil, 0, errShape // trailing data
	}
	out = append(out, '}')
	if !json.Valid(out) { // what the scanner let through unchecked (numbers, control characters)
		return nil, 0, errShape
	}
	return out, t.runs, nil
}

type trimmer struct {
	k    Keep
	runs int
	// Of the kept runs: their ids, the user messages they were made of, the
	// checkpoints they point at.
	runIDs, msgIDs, checkpointIDs map[string]bool
}

type span struct{ start, end int }

// projection appends the trimmed projection object; s is at its value. The
// runs decide what else is kept. T3 sends them before the messages,
// checkpoints and requests, which are then filtered in the same pass; a
// field that needs the runs and comes before them is skipped, remembered and
// filtered once the runs are known. Each field's output is a piece: its
// kept bytes, or a span of the body copied as it is.
func (t *trimmer) projection(out []byte, s *scanner) ([]byte, error) {
	type piece struct {
		key      []byte
		val      span   // the field's value in the body
		filtered []byte // the value to write instead, once filtered
		deferred bool   // filter val once the runs are known
	}
	var pieces []piece
	t.runIDs, t.msgIDs, t.checkpointIDs = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, id := range t.k.MessageIDs {
		t.msgIDs[id] = true
	}
	runsKnown := false
	err := s.obj(func(key []byte) error {
		start := s.i
		var err error
		p := piece{key: key}
		switch string(key) {
		case "runs":
			p.filtered, err = t.keepRuns(s)
			runsKnown = true
		case "messages", "checkpoints":
			if !runsKnown {
				err, p.deferred = s.skip(), true
				break
			}
			p.filtered, err = t.filterField(key, s)
		case "runtimeRequests": // kept by status and id, not by run
			p.filtered, err = t.filterField(key, s)
		default:
			err = s.skip()
		}
		p.val = span{start, s.i}
		pieces = append(pieces, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	out = append(out, '{')
	for i, p := range pieces {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(append(append(out, '"'), p.key...), '"', ':')
		switch {
		case p.deferred:
			sub := scanner{b: s.b[:p.val.end], i: p.val.start}
			if p.filtered, err = t.filterField(p.key, &sub); err != nil {
				return nil, err
			}
			out = append(out, p.filtered...)
		case p.filtered != nil:
			out = append(out, p.filtered...)
		default:
			out = append(out, s.b[p.val.start:p.val.end]...)
		}
	}
	return append(out, '}'), nil
}

// filterField filters the messages, checkpoints or runtime requests array at
// s by what the kept runs need.
func (t *trimmer) filterField(key []byte, s *scanner) ([]byte, error) {
	switch string(key) {
	case "messages":
		return filter(s, func(id, runID, _ []byte) bool {
			return t.runIDs[string(runID)] || t.msgIDs[string(id)]
		})
	case "checkpoints":
		return filter(s, func(id, runID, _ []byte) bool {
			return t.runIDs[string(runID)] || t.checkpointIDs[string(id)]
		})
	default: // runtimeRequests
		return filter(s, func(id, _, status []byte) bool {
			return string(status) == "pending" || contains(t.k.RequestIDs, id)
		})
	}
}

// run is a run element as scanned: where it sits, its ordinal, and whether a
// Keep names it.
type run struct {
	at      span
	ordinal int64
	named   bool
}

// keepRuns scans the runs array at s and returns it with only the kept runs
// (the newest k.Runs and the named ones), in T3's order, recording in t what
// they point at.
func (t *trimmer) keepRuns(s *scanner) ([]byte, error) {
	n := max(1, t.k.Runs)
	var newest []run // the n newest so far, by ordinal ascending
	var named []run
	err := s.arr(func() error {
		t.runs++
		el := run{at: span{start: s.i}}
		err := s.obj(func(key []byte) error {
			switch string(key) {
			case "ordinal":
				o, err := s.int()
				el.ordinal = o
				return err
			case "id":
				id, ok, err := s.str()
				el.named = el.named || ok && contains(t.k.RunIDs, id)
				return err
			case "userMessageId":
				id, ok, err := s.str()
				el.named = el.named || ok && contains(t.k.MessageIDs, id)
				return err
			}
			return s.skip()
		})
		el.at.end = s.i
		if err != nil {
			return err
		}
		switch {
		case el.named:
			named = append(named, el)
		case len(newest) < n || el.ordinal > newest[0].ordinal:
			i, _ := slices.BinarySearchFunc(newest, el.ordinal, func(r run, o int64) int {
				switch {
				case r.ordinal < o:
					return -1
				case r.ordinal > o:
					return 1
				}
				return 0
			})
			newest = slices.Insert(newest, i, el)
			if len(newest) > n {
				newest = newest[1:]
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	kept := make([]span, 0, len(newest)+len(named))
	for _, r := range append(newest, named...) {
		kept = append(kept, r.at)
		if err := t.note(s.b, r.at); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(kept, func(a, b span) int { return a.start - b.start })
	out := make([]byte, 0, 64)
	out = append(out, '[')
	for j, r := range kept {
		if j > 0 {
			out = append(out, ',')
		}
		out = append(out, s.b[r.start:r.end]...)
	}
	return append(out, ']'), nil
}

// note records a kept run's id and what it points at.
func (t *trimmer) note(b []byte, at span) error {
	s := scanner{b: b[:at.end], i: at.start}
	return s.obj(func(key []byte) error {
		var into map[string]bool
		switch string(key) {
		case "id":
			into = t.runIDs
		case "userMessageId":
			into = t.msgIDs
		case "checkpointId":
			into = t.checkpointIDs
		default:
			return s.skip()
		}
		v, ok, err := s.str()
		if ok {
			into[string(v)] = true
		}
		return err
	})
}

// filter scans the array at s and returns it with the elements keep accepts,
// judged by their "id", "runId" and "status" strings (nil when absent or not
// strings).
func filter(s *scanner, keep func(id, runID, status []byte) bool) ([]byte, error) {
	out := make([]byte, 0, 64)
	out = append(out, '[')
	first := true
	err := s.arr(func() error {
		start := s.i
		var id, runID, status []byte
		err := s.obj(func(key []byte) error {
			var into *[]byte
			switch string(key) {
			case "id":
				into = &id
			case "runId":
				into = &runID
			case "status":
				into = &status
			default:
				return s.skip()
			}
			v, ok, err := s.str()
			if ok {
				*into = v
			}
			return err
		})
		if err != nil {
			return err
		}
		if keep(id, runID, status) {
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, s.b[start:s.i]...)
		}
		return nil
	})
	return append(out, ']'), err
}

// contains reports whether b is one of ids (without converting b).
func contains(ids []string, b []byte) bool {
	for _, id := range ids {
		if id == string(b) {
			return true
		}
	}
	return false
}

// scanner walks JSON text without decoding what it skips. It checks the
// structure (brackets, strings, commas, colons); what it does not check (the
// characters of numbers and literals, control characters in strings) the
// caller's json.Valid of the much smaller output does.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// obj walks an object; fn is called at each value (s.i at its first byte)
// and must consume it.
func (s *scanner) obj(fn func(key []byte) error) error {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return errShape
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		key, ok, err := s.str()
		if err != nil || !ok {
			return errShape
		}
		if s.ws(); s.i >= len(s.b) || s.b[s.i] != ':' {
			return errShape
		}
		s.i++
		s.ws()
		if err := fn(key); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errShape
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.ws()
		case '}':
			s.i++
			return nil
		default:
			return errShape
		}
	}
}

// arr walks an array; fn is called at each element and must consume it.
func (s *scanner) arr(fn func() error) error {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '[' {
		return errShape
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return nil
	}
	for {
		s.ws()
		if err := fn(); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errShape
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return errShape
		}
	}
}

// str reads a string value: its bytes, unescaped when it holds an escape
// (rare in T3's ids). ok is false, and the value skipped, for any other type.
func (s *scanner) str() (v []byte, ok bool, err error) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, s.skip()
	}
	start := s.i
	if err := s.skipString(); err != nil {
		return nil, false, err
	}
	raw := s.b[start+1 : s.i-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, true, nil
	}
	var u string
	if err := json.Unmarshal(s.b[start:s.i], &u); err != nil {
		return nil, false, errShape
	}
	return []byte(u), true, nil
}

// int reads an integer value (0, skipped, for any other type).
func (s *scanner) int() (int64, error) {
	start := s.i
	if err := s.skip(); err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	if err != nil {
		return 0, nil // not an integer: the decoder of the output says so if it matters
	}
	return v, nil
}

// skipString moves past the string starting at s.i. Most of a thread's
// strings are short (keys, ids, timestamps): their first bytes are looked at
// one by one, and only a longer string is searched with bytes.IndexByte,
// whose call costs more than a short string's loop.
func (s *scanner) skipString() error {
	i := s.i + 1
	for end := min(i+shortString, len(s.b)); i < end; i++ {
		switch s.b[i] {
		case '"':
			s.i = i + 1
			return nil
		case '\\':
			return s.skipEscaped(i)
		}
	}
	return s.skipEscaped(i)
}

// shortString is how many bytes of a string skipString looks at one by one.
const shortString = 32

// skipEscaped moves past the string starting at s.i, searching from i (which
// is past the opening quote) with bytes.IndexByte; a quote is the end unless
// an odd number of backslashes precedes it.
func (s *scanner) skipEscaped(i int) error {
	for {
		j := bytes.IndexByte(s.b[i:], '"')
		if j < 0 {
			return errShape
		}
		i += j
		bs := 0
		for k := i - 1; k > s.i && s.b[k] == '\\'; k-- {
			bs++
		}
		i++
		if bs%2 == 0 {
			s.i = i
			return nil
		}
	}
}

// skip moves past one value.
func (s *scanner) skip() error {
	s.ws()
	if s.i >= len(s.b) {
		return errShape
	}
	switch c := s.b[s.i]; c {
	case '"':
		return s.skipString()
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if err := s.skipString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return nil
				}
			}
			s.i++
		}
		return errShape
	default:
		start := s.i
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				if s.i == start {
					return errShape
				}
				return nil
			case '"', '{', '[', ':':
				return errShape
			}
			s.i++
		}
		if s.i == start {
			return errShape
		}
		return nil
	}
}

// readBody reads a response body into a pooled buffer, grown to its announced
// length at once. A body of megabytes read into a fresh slice (io.ReadAll,
// or a buffer grown as it fills, when T3 sends it chunked, as it does for
// thread reads) is allocated, cleared and copied several times over: that
// was half of t3_thread's CPU at 5,000 items. Give the buffer back with
// putBody once nothing refers to it.
func readBody(r io.Reader, length int64) (*bytes.Buffer, error) {
	b := getBody()
	b.Reset()
	if length > 0 && length < maxPooledBody {
		b.Grow(int(length) + bytes.MinRead)
	}
	_, err := b.ReadFrom(r)
	return b, err
}

// Body buffers: up to keptBodies of at most maxKeptBody are kept for good
// (a sync.Pool empties at every garbage collection, and a t3_thread call now
// and then found it empty and grew a new buffer through every size up to the
// body's, which also made the collections it then waited for more frequent);
// larger ones, up to maxPooledBody, go to a sync.Pool.
var (
	keptBody = make(chan *bytes.Buffer, keptBodies)
	bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}
)

const (
	keptBodies    = 2
	maxKeptBody   = 4 << 20  // a 5,000-item thread's bounded body is 1.6 MiB
	maxPooledBody = 32 << 20 // bounds the buffers kept between reads
)

func getBody() *bytes.Buffer {
	select {
	case b := <-keptBody:
		return b
	default:
		return bodyBufs.Get().(*bytes.Buffer)
	}
}

func putBody(b *bytes.Buffer) {
	switch {
	case b.Cap() <= maxKeptBody:
		select {
		case keptBody <- b:
		default:
			bodyBufs.Put(b)
		}
	case b.Cap() <= maxPooledBody:
		bodyBufs.Put(b)
	}
}
