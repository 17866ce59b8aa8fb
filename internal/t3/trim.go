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
// runs decide what else is kept, and T3 may send them after the messages:
// each field's place is found first (one skip), then written in its order.
func (t *trimmer) projection(out []byte, s *scanner) ([]byte, error) {
	type field struct {
		key []byte
		val span
	}
	var fields []field
	err := s.obj(func(key []byte) error {
		start := s.i
		err := s.skip()
		fields = append(fields, field{key, span{start, s.i}})
		return err
	})
	if err != nil {
		return nil, err
	}
	t.runIDs, t.msgIDs, t.checkpointIDs = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, id := range t.k.MessageIDs {
		t.msgIDs[id] = true
	}
	var keptRuns []span
	for _, f := range fields {
		if string(f.key) == "runs" {
			if keptRuns, err = t.keepRuns(s.b, f.val); err != nil {
				return nil, err
			}
		}
	}
	out = append(out, '{')
	for i, f := range fields {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(append(append(out, '"'), f.key...), '"', ':')
		switch string(f.key) {
		case "runs":
			out = append(out, '[')
			for j, r := range keptRuns {
				if j > 0 {
					out = append(out, ',')
				}
				out = append(out, s.b[r.start:r.end]...)
			}
			out = append(out, ']')
		case "messages":
			out, err = filter(out, s.b, f.val, func(id, runID, _ []byte) bool {
				return t.runIDs[string(runID)] || t.msgIDs[string(id)]
			})
		case "checkpoints":
			out, err = filter(out, s.b, f.val, func(id, runID, _ []byte) bool {
				return t.runIDs[string(runID)] || t.checkpointIDs[string(id)]
			})
		case "runtimeRequests":
			out, err = filter(out, s.b, f.val, func(id, _, status []byte) bool {
				return string(status) == "pending" || contains(t.k.RequestIDs, id)
			})
		default:
			out = append(out, s.b[f.val.start:f.val.end]...)
		}
		if err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

// run is a run element as scanned: where it sits, its ordinal, and whether a
// Keep names it.
type run struct {
	at      span
	ordinal int64
	named   bool
}

// keepRuns scans the runs array at v and returns the kept runs' places in
// T3's order (the newest k.Runs and the named ones), recording in t what they
// point at.
func (t *trimmer) keepRuns(b []byte, v span) ([]span, error) {
	n := max(1, t.k.Runs)
	var newest []run // the n newest so far, by ordinal ascending
	var named []run
	s := scanner{b: b[:v.end], i: v.start}
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
		if err := t.note(b, r.at); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(kept, func(a, b span) int { return a.start - b.start })
	return kept, nil
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

// filter appends the array at v with the elements keep accepts, judged by
// their "id", "runId" and "status" strings (nil when absent or not strings).
func filter(out, b []byte, v span, keep func(id, runID, status []byte) bool) ([]byte, error) {
	s := scanner{b: b[:v.end], i: v.start}
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
			out = append(out, b[start:s.i]...)
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

// skipString moves past the string starting at s.i.
func (s *scanner) skipString() error {
	i := s.i + 1
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
// or a buffer grown as it fills, when T3 sends it chunked) is allocated,
// cleared and copied several times over: that was half of t3_thread's CPU
// at 5,000 items. Give the buffer back with putBody once nothing refers to it.
func readBody(r io.Reader, length int64) (*bytes.Buffer, error) {
	b := bodyBufs.Get().(*bytes.Buffer)
	b.Reset()
	if length > 0 && length < maxPooledBody {
		b.Grow(int(length) + bytes.MinRead)
	}
	_, err := b.ReadFrom(r)
	return b, err
}

var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody bounds the buffers kept between reads.
const maxPooledBody = 32 << 20

func putBody(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBody {
		bodyBufs.Put(b)
	}
}
