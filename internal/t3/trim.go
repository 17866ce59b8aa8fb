package t3

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/bits"
	"slices"
	"strconv"
	"sync"
)

// Keep says which part of a bounded thread read (GET …/threads/{id}/bounded)
// a caller needs. T3's bounded body windows the timeline rows (the newest ten
// user turns; without turn starts, at most 75 rows) and the messages (those the window names, the
// latest and active runs'), but carries every run, attempt, node, checkpoint
// and runtime request of the thread, so it grows with the thread's runs
// (1.7 MiB at 5,000 turn items of 1,000 runs, 16 MiB at 50,000: ≈ 1.7 kB a
// run). A read with a Keep decodes only the runs the caller names and what
// belongs to them; the rest is skipped without being decoded.
//
// What is kept: the newest Runs runs by ordinal, the runs named in RunIDs,
// the runs T3 made of the user messages in MessageIDs; the messages,
// checkpoints and timeline rows of the kept runs (and the messages and
// checkpoints the kept runs point at); the runtime requests in RequestIDs
// and every pending one, and the timeline rows of those requests (a
// question's row); the thread itself and its updatedAt, as T3 sent them. The
// projection's other parts (attempts, nodes, provider sessions, plans, …: what
// the generated types do not have) are left out.
// Timeline rows of other runs, and rows of no run, are left out: what reads
// a trimmed projection (threadview, the events' enrichment, t3_wait) looks
// rows up by a kept run or a kept request only.
type Keep struct {
	Runs       int // the newest runs by ordinal; at least 1
	RunIDs     []string
	MessageIDs []string
	RequestIDs []string
}

var errShape = errors.New("bounded body: not the shape of a bounded thread snapshot")

// trimBoundedFrom rewrites the bounded thread body r streams to the part k
// keeps, in the same shape (a BoundedThreadSnapshot, keys in T3's order, kept
// elements byte for byte as T3 sent them), and returns how many runs the
// thread has in all. Nothing skipped is decoded: a small scanner jumps over
// values (over strings, where nearly all of a thread's bytes are, eight bytes
// at a time) and looks only at the keys that decide (ids, ordinal, status),
// an element of the big arrays in one loop (fields). The body is scanned as it
// arrives, in a window of the body that holds only what is still to be
// copied out (the field or element being scanned, the runs kept so far), not
// in a buffer of the whole body, which at 50,000 turn items is 16 MiB read,
// kept and scanned again after it has left the processor's caches. The body
// is read to its end. window is the window's first size (it grows when one
// value needs more); 0 means a pooled buffer. A read error is returned as it
// is; errShape means the body is not a bounded snapshot (what was read of it
// is gone: the caller reads it again to report what is wrong). The trimmed
// body is appended to dst (dst[:0] reuses a buffer: nothing else is
// allocated for the output, which t3_thread reads on every call).
func trimBoundedFrom(r io.Reader, k Keep, window int, dst []byte) (out []byte, runs int, err error) {
	var buf *[]byte
	if window <= 0 {
		buf = getWindow()
		defer func() { putWindow(buf) }()
	} else {
		b := make([]byte, 0, window)
		buf = &b
	}
	s := scanner{b: (*buf)[:0], src: &source{r: r}}
	out, runs, err = s.trim(k, dst)
	*buf = s.b[:0] // the window as it grew
	if s.src.err != nil {
		return nil, 0, s.src.err
	}
	return out, runs, err
}

// trim is trimBounded of the body s scans, appended to dst.
func (s *scanner) trim(k Keep, dst []byte) (out []byte, runs int, err error) {
	t := getTrimmer(k)
	defer putTrimmer(t)
	return s.trimWith(t, dst)
}

// trimWith is trim with the trimmer t (k set, maps empty).
func (s *scanner) trimWith(t *trimmer, dst []byte) (out []byte, runs int, err error) {
	out = append(dst, '{')
	first := true
	err = s.obj(func(key []byte) error {
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(append(append(out, '"'), key...), '"', ':')
		if string(key) != "projection" {
			start := s.retain()
			if err := s.skip(); err != nil {
				return err
			}
			out = append(out, s.from(start)...)
			return nil
		}
		var err error
		out, err = t.projection(out, s)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	s.release()
	if s.ws(); s.i != len(s.b) {
		return nil, 0, errShape // trailing data
	}
	out = append(out, '}')
	if !json.Valid(out[len(dst):]) { // what the scanner let through unchecked (numbers, control characters)
		return nil, 0, errShape
	}
	return out, t.runs, nil
}

type trimmer struct {
	k    Keep
	runs int
	// Of the kept runs: their ids, the user messages they were made of, the
	// checkpoints they point at; the kept requests (named or pending).
	runIDs, msgIDs, checkpointIDs, reqIDs map[string]bool
	// The projection's fields as they are scanned, before they are written
	// out in order (projection): one buffer for all, kept between trims
	// with the maps (trimmers).
	scratch []byte
	newest  []run
	named   []run
}

// trimmers keeps trimmers (their maps and buffers) between trims: a
// t3_thread call otherwise allocated a new output and scratch buffer per
// field, grown by doubling, several times the few kilobytes it keeps.
var trimmers = sync.Pool{New: func() any { return newTrimmer() }}

func newTrimmer() *trimmer {
	return &trimmer{runIDs: map[string]bool{}, msgIDs: map[string]bool{}, checkpointIDs: map[string]bool{}, reqIDs: map[string]bool{}}
}

// maxKeptScratch is the largest scratch buffer a kept trimmer holds on to.
const maxKeptScratch = 1 << 20

func getTrimmer(k Keep) *trimmer {
	t := trimmers.Get().(*trimmer)
	t.k, t.runs = k, 0
	return t
}

func putTrimmer(t *trimmer) {
	if cap(t.scratch) > maxKeptScratch {
		return
	}
	clear(t.runIDs)
	clear(t.msgIDs)
	clear(t.checkpointIDs)
	clear(t.reqIDs)
	t.k, t.scratch, t.newest, t.named = Keep{}, t.scratch[:0], t.newest[:0], t.named[:0]
	trimmers.Put(t)
}

// span is a part of the body by position in the body (scanner.pos).
type span struct{ start, end int }

// projection appends the trimmed projection object; s is at its value. The
// runs decide what else is kept. T3 sends them before the messages,
// checkpoints and requests, which are then filtered in the same pass; a
// field that needs the runs and comes before them is copied, and filtered
// once the runs are known. Each field's output is a piece: its kept bytes,
// or its bytes as they came.
func (t *trimmer) projection(out []byte, s *scanner) ([]byte, error) {
	type piece struct {
		key      span // in t.scratch: the key (unquoted, as it came)
		val      span // in t.scratch: the field's output
		deferred bool // val is the field as it came: filter it once the runs (and requests) are known
	}
	var pieces [16]piece // T3's projection has 7 fields
	fields := pieces[:0]
	for _, id := range t.k.MessageIDs {
		t.msgIDs[id] = true
	}
	for _, id := range t.k.RequestIDs {
		t.reqIDs[id] = true
	}
	runsKnown, requestsKnown := false, false
	err := s.obj(func(key []byte) error {
		var err error
		p := piece{key: span{len(t.scratch), len(t.scratch) + len(key)}}
		t.scratch = append(t.scratch, key...) // key is in the window, which moves while the value is read
		name := t.scratch[p.key.start:p.key.end]
		p.val.start = len(t.scratch)
		switch string(name) {
		case "runs":
			t.scratch, err = t.keepRuns(t.scratch, s)
			runsKnown = true
		case "messages", "checkpoints", "turnItems":
			if !runsKnown || string(name) == "turnItems" && !requestsKnown {
				start := s.retain()
				err, p.deferred = s.skip(), true
				t.scratch = append(t.scratch, s.from(start)...)
				break
			}
			t.scratch, err = t.filterField(t.scratch, string(name), s)
		case "runtimeRequests": // kept by status and id, not by run
			t.scratch, err = t.filterField(t.scratch, string(name), s)
			requestsKnown = true
		case "thread", "updatedAt":
			start := s.retain()
			err = s.skip()
			t.scratch = append(t.scratch, s.from(start)...)
		default:
			// A part of T3's projection no decoder here reads (attempts, nodes, subagents,
			// providerSessions, providerThreads, providerTurns, plans, checkpointScopes,
			// contextHandoffs, contextTransfers, visibleTurnItems: the recorded builds send
			// them all, most with an element per run): skipped, not copied. Copied, each was
			// scanned again by json.Valid and once more by the decoder that ignores it.
			t.scratch = t.scratch[:p.key.start]
			return s.skipFree()
		}
		p.val.end = len(t.scratch)
		s.release()
		fields = append(fields, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	out = append(out, '{')
	for i, p := range fields {
		if i > 0 {
			out = append(out, ',')
		}
		key := t.scratch[p.key.start:p.key.end]
		out = append(append(append(out, '"'), key...), '"', ':')
		val := t.scratch[p.val.start:p.val.end]
		if !p.deferred {
			out = append(out, val...)
			continue
		}
		sub := scanner{b: val}
		if out, err = t.filterField(out, string(key), &sub); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

// filterField appends to dst the messages, checkpoints, runtime requests or
// timeline rows array at s, filtered by what the kept runs need.
func (t *trimmer) filterField(dst []byte, key string, s *scanner) ([]byte, error) {
	switch key {
	case "messages":
		return filter(dst, s, &idRunKeys, func(id, runID, _ []byte) bool {
			return t.runIDs[string(runID)] || t.msgIDs[string(id)]
		})
	case "checkpoints":
		return filter(dst, s, &idRunKeys, func(id, runID, _ []byte) bool {
			return t.runIDs[string(runID)] || t.checkpointIDs[string(id)]
		})
	case "turnItems":
		return filter(dst, s, &itemKeys, func(runID, requestID, _ []byte) bool {
			return t.runIDs[string(runID)] || t.reqIDs[string(requestID)]
		})
	default: // runtimeRequests
		return filter(dst, s, &requestKeys, func(id, _, status []byte) bool {
			if string(status) == "pending" {
				t.reqIDs[string(id)] = true // its question's row is kept
				return true
			}
			return contains(t.k.RequestIDs, id)
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

// keepRuns scans the runs array at s and appends it to dst with only the
// kept runs (the newest k.Runs and the named ones), in T3's order, recording
// in t what they point at. The window holds the body from the first kept run
// so far: T3 lists runs oldest first, so that is the last few runs, not the
// array.
func (t *trimmer) keepRuns(dst []byte, s *scanner) ([]byte, error) {
	n := max(1, t.k.Runs)
	newest := slices.Grow(t.newest[:0], n) // the n newest so far, by ordinal ascending
	named := t.named[:0]
	defer func() { t.newest, t.named = newest[:0], named[:0] }()
	err := s.arr(func() error {
		t.runs++
		el := run{at: span{start: s.pos()}}
		// Retain from the first kept run so far (named runs are in body order).
		from := el.at.start
		for _, r := range newest {
			from = min(from, r.at.start)
		}
		if len(named) > 0 {
			from = min(from, named[0].at.start)
		}
		s.keep = from
		var at [3]span
		err := s.fields(runKeys[:], at[:])
		if err == nil {
			el.ordinal = s.intAt(at[0])
			id, idOK, err1 := s.strAt(at[1])
			msg, msgOK, err2 := s.strAt(at[2])
			el.named = idOK && contains(t.k.RunIDs, id) || msgOK && contains(t.k.MessageIDs, msg)
			err = cmp.Or(err1, err2)
		}
		el.at.end = s.pos()
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
			if len(newest) < n {
				newest = slices.Insert(newest, i, el) // within its capacity: no allocation
				break
			}
			// Full: the oldest (newest[0]) drops out, those below i move down
			// one. In place: T3 lists runs oldest first, so this runs for
			// nearly every run, and a slice grown and resliced from the front
			// allocated every few runs.
			copy(newest[:i-1], newest[1:i])
			newest[i-1] = el
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	newest = append(newest, named...) // all kept; named is empty or past newest's capacity
	for _, r := range newest {
		if err := t.note(s.in(r.at)); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(newest, func(a, b run) int { return a.at.start - b.at.start })
	out := append(dst, '[')
	for j, r := range newest {
		if j > 0 {
			out = append(out, ',')
		}
		out = append(out, s.in(r.at)...)
	}
	return append(out, ']'), nil
}

// note records a kept run's id and what it points at; el is the run's object.
func (t *trimmer) note(el []byte) error {
	s := scanner{b: el}
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

// filter scans the array at s and appends it to dst with the elements keep
// accepts, judged by the strings of their keys (nil when absent or not
// strings).
func filter(dst []byte, s *scanner, keys *[3]string, keep func(a, b, c []byte) bool) ([]byte, error) {
	out := append(dst, '[')
	first := true
	var at [3]span
	err := s.arr(func() error {
		start := s.retain()
		if err := s.fields(keys[:], at[:]); err != nil {
			return err
		}
		a, _, err1 := s.strAt(at[0])
		b, _, err2 := s.strAt(at[1])
		c, _, err3 := s.strAt(at[2])
		if err := cmp.Or(err1, err2, err3); err != nil {
			return err
		}
		if keep(a, b, c) {
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, s.from(start)...)
		}
		return nil
	})
	return append(out, ']'), err
}

// The keys whose values decide: of a run, of a message or checkpoint, of a
// runtime request, and of a timeline row. Only those: fields skips the rest
// of an object once it has them all.
var (
	runKeys     = [...]string{"ordinal", "id", "userMessageId"}
	idRunKeys   = [...]string{"id", "runId", ""}
	requestKeys = [...]string{"id", "", "status"}
	itemKeys    = [...]string{"runId", "requestId", ""}
)

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
//
// With a source, b is a window of the body, refilled as the scan reaches its
// end (more): b[0] is the body's byte base, and bytes before keep, which the
// trimmer moves forward as it copies out what it keeps, may be dropped to
// make room. So positions that outlive a read of more input are body
// positions (pos), and a slice of b is used before the scan moves on.
type scanner struct {
	b    []byte
	i    int // the scan's index in b
	base int // the body position of b[0]
	keep int // the first body position still needed
	src  *source
	// free: the value being scanned is not kept (skipFree), so the window
	// may drop what the scan has passed.
	free bool
}

// source is the rest of a streamed body.
type source struct {
	r    io.Reader
	err  error // a read error other than io.EOF
	done bool
}

// pos is the scan's position in the body.
func (s *scanner) pos() int { return s.base + s.i }

// retain keeps the body from the scan's position on in the window, and returns that position.
func (s *scanner) retain() int {
	s.keep = s.pos()
	return s.keep
}

// release lets the window drop everything before the scan's position.
func (s *scanner) release() { s.keep = s.pos() }

// from is the body from position start (retained) to the scan's position.
func (s *scanner) from(start int) []byte { return s.b[start-s.base : s.i] }

// in is the body's bytes at sp (retained).
func (s *scanner) in(sp span) []byte { return s.b[sp.start-s.base : sp.end-s.base] }

// Window sizes: reads of at most readBlock bytes, so that what was read is
// scanned while it is still in the processor's cache; a window starts at
// firstWindow and grows when a retained value needs more.
const (
	readBlock   = 256 << 10
	firstWindow = 256 << 10
)

// more reads more of the body into the window, making room first by dropping
// what is no longer needed or by growing it. It reports whether any was read.
func (s *scanner) more() bool {
	src := s.src
	if src == nil || src.done {
		return false
	}
	if s.free {
		s.keep = s.pos()
	}
	if len(s.b) == cap(s.b) {
		if drop := s.keep - s.base; drop > 0 && drop >= len(s.b)/4 {
			n := copy(s.b, s.b[drop:])
			s.b, s.base, s.i = s.b[:n], s.base+drop, s.i-drop
		} else {
			b := make([]byte, len(s.b), max(2*cap(s.b), firstWindow))
			copy(b, s.b)
			s.b = b
		}
	}
	for range 100 {
		n, err := src.r.Read(s.b[len(s.b):min(cap(s.b), len(s.b)+readBlock)])
		s.b = s.b[:len(s.b)+n]
		if err != nil {
			src.done = true
			if err != io.EOF {
				src.err = err
			}
			return n > 0
		}
		if n > 0 {
			return true
		}
	}
	src.done, src.err = true, io.ErrNoProgress
	return false
}

// ws moves past whitespace (none, in T3's bodies: the first test is the
// inlined fast path).
func (s *scanner) ws() {
	if s.i < len(s.b) && s.b[s.i] > ' ' {
		return
	}
	s.wsSlow()
}

func (s *scanner) wsSlow() {
	for {
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ' ', '\t', '\n', '\r':
				s.i++
			default:
				return
			}
		}
		if !s.more() {
			return
		}
	}
}

// obj walks an object; fn is called at each value (s.i at its first byte)
// and must consume it. key is valid until fn reads on.
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
		s.ws()
		at := s.pos() + 1 // the key's first byte, when it has no escape
		key, ok, err := s.str()
		if err != nil || !ok {
			return errShape
		}
		inWindow := len(key) > 0 && &key[0] == &s.b[at-s.base]
		if s.ws(); s.i >= len(s.b) || s.b[s.i] != ':' {
			return errShape
		}
		s.i++
		s.ws()
		if inWindow { // the window may have moved while reading on to the value
			key = s.b[at-s.base : at-s.base+len(key)]
		}
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
// (rare in T3's ids), valid until the scan reads on. ok is false, and the
// value skipped, for any other type.
func (s *scanner) str() (v []byte, ok bool, err error) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, s.skip()
	}
	start := s.pos()
	if err := s.skipString(); err != nil {
		return nil, false, err
	}
	v, err = unquote(s.from(start))
	return v, err == nil, err
}

// unquote is the content of a JSON string (quotes included in quoted): its
// bytes as they are, or unescaped when it holds an escape.
func unquote(quoted []byte) ([]byte, error) {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, nil
	}
	var u string
	if err := json.Unmarshal(quoted, &u); err != nil {
		return nil, errShape
	}
	return []byte(u), nil
}

// skipString moves past the string starting at s.i. Most of a thread's
// strings are short (keys, ids, timestamps): their first bytes are looked at
// one by one, and only a longer string is searched with bytes.IndexByte,
// whose call costs more than a short string's loop.
func (s *scanner) skipString() error {
	i := quoteOrEscape(s.b, s.i+1)
	if i < len(s.b) && s.b[i] == '"' {
		s.i = i + 1
		return nil
	}
	return s.skipEscaped(i)
}

// shortString is how many bytes of a string quoteOrEscape looks at, eight at
// a time; a longer string is searched with bytes.IndexByte, whose call costs
// more than a short string's loop.
const shortString = 64

// quoteOrEscape is the index of the first '"' or '\\' in b from i on, looking
// at up to shortString bytes eight at a time (SWAR: a byte equal to c is a
// zero byte of x^(c×0x01…01); the lowest byte flagged by the zero test is
// exact); i+shortString or len(b), whichever is less, when there is none.
func quoteOrEscape(b []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	end := min(i+shortString, len(b))
	// Eight bytes at a time while eight are left in b, past end if need be
	// (a short string's quote is then found in one step).
	for ; i < end && i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		q, e := x^(ones*'"'), x^(ones*'\\')
		if m := ((q-ones)&^q | (e-ones)&^e) & highs; m != 0 {
			return min(i+bits.TrailingZeros64(m)>>3, end)
		}
	}
	for ; i < end; i++ {
		if b[i] == '"' || b[i] == '\\' {
			return i
		}
	}
	return end
}

// skipEscaped moves past the string starting at s.i, searching from i (which
// is past the opening quote) with bytes.IndexByte; a quote is the end unless
// an odd number of backslashes precedes it.
func (s *scanner) skipEscaped(i int) error {
	for {
		j := bytes.IndexByte(s.b[i:], '"')
		if j < 0 {
			// The string goes on past the window: read on (the window may
			// move; the string's start, s.i, stays in it).
			off := len(s.b) - s.i
			if !s.more() {
				return errShape
			}
			i = s.i + off
			continue
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

// fields moves past the object at s.i, as skip does, and sets at[k] to the
// body positions of the value of its own key keys[k] when that value is a
// string (quotes included) or a number or literal; {0, 0} when it has no such
// value. The arrays a bounded body grows with (runs, messages, checkpoints,
// requests) are thousands of objects of which two or three keys matter: the
// object is walked by the 64-byte block masks skipContainer uses
// (fieldsMasked), which look only at brackets, commas and where a key
// starts, and byte by byte (fieldsBytes) only from a key to its value's end
// (the key's own bytes decide whether it is one of keys) and through a block
// with a backslash. Like skip, it checks brackets and strings; the kept
// elements are checked by json.Valid of the output.
//
// Once every key of keys (but "") has its value, the rest of the object is
// skipped as skipContainer skips (skipRest): T3 puts the keys that decide
// in the first half of each object (a run's id, ordinal and userMessageId, a
// checkpoint's or a message's id and runId), and walking the rest key by key
// was more than half of the trim at 50,000 turn items (BenchmarkTrimBounded). So
// a key that comes again after all were found is not looked at: its first
// value is the one taken (T3's objects have no key twice).
func (s *scanner) fields(keys []string, at []span) error {
	clear(at)
	if s.ws(); s.i >= len(s.b) || s.b[s.i] != '{' {
		return errShape
	}
	f := fieldState{want: -1, lit: -1}
	for k, key := range keys {
		if key != "" {
			f.all |= 1 << k
		}
	}
	for {
		done, stop, err := s.fieldsMasked(&f, keys, at)
		if done || err != nil {
			return err
		}
		if f.found == f.all {
			return s.skipRest()
		}
		if done, err = s.fieldsBytes(&f, keys, at, stop); done || err != nil {
			return err
		}
		if f.found == f.all {
			return s.skipRest()
		}
	}
}

// fieldState is where fields is in the object: its depth (the object's own
// keys are at 1), whether the next string at depth 1 is a key, the index in
// keys of the key whose value comes next (-1: none) and the body position of
// a wanted number or literal being read (-1: none); and which keys have their
// value (bit k for keys[k]) of all those fields looks for.
type fieldState struct {
	depth      int
	expectKey  bool
	want, lit  int
	found, all uint8
}

// got records that keys[k] has its value, and reports whether every key
// fields looks for has one now: its caller then stops at the value's end
// (outside any string, at depth 1) and fields skips the rest.
func (f *fieldState) got(k int) bool {
	f.found |= 1 << k
	return f.found == f.all
}

// fieldsMasked walks the object from s.i by 64-byte blocks (blockState's
// masks, plus commas), with f.want and f.lit -1 and s.i outside any string:
// the keys that are not in keys, and the string values of those that are,
// are read off the masks when they end in the block they start in. It
// returns done at the object's end; or, with s.i at a key it leaves to
// fieldsBytes (a number's, a literal's or an object's key, one that goes on
// into the next block) or at a block that holds a backslash (or the string
// that block starts inside), the body position up to which fieldsBytes is to
// go on.
func (s *scanner) fieldsMasked(f *fieldState, keys []string, at []span) (done bool, stop int, err error) {
	var inString uint64
	opened := 0 // the body position of the last string's opening quote
	// A string at depth 1 that goes on into the next block, read there off
	// its closing quote (the block's first quote): a key (pendKey, f.expectKey
	// still set), or the string value of keys[pendVal]. Without this, each went
	// byte by byte (fieldsBytes) and the masks were taken again from where
	// that ended: a run's id and its checkpoint's are ≈ 40 bytes, and one in
	// two crossed a block.
	pendKey, pendVal := false, -1
	var pad [64]byte
	for {
		b, i := s.b, s.i
		for i < len(b) {
			var p *[64]byte
			if i+64 <= len(b) {
				p = (*[64]byte)(b[i : i+64])
			} else if s.i = i; s.more() {
				b, i = s.b, s.i
				continue
			} else { // the body's last bytes: padded with spaces
				n := copy(pad[:], b[i:])
				for j := n; j < len(pad); j++ {
					pad[j] = ' '
				}
				p = &pad
			}
			quote, bslash, open, close, comma := masks(p)
			if bslash != 0 {
				stop := s.base + i + 64
				if s.i = i; inString != 0 {
					s.i = opened - s.base // byte by byte from outside any string
					if pendVal >= 0 {
						f.want = pendVal // the string at opened is its value
					}
				}
				return false, stop, nil
			}
			if pendKey || pendVal >= 0 {
				if quote == 0 { // the string goes on through this block
					i += 64
					if p == &pad {
						s.i = len(b)
						return false, 0, errShape
					}
					continue
				}
				end := s.base + i + bits.TrailingZeros64(quote) // its closing quote
				if pendVal >= 0 {
					at[pendVal] = span{opened, end + 1}
					if f.got(pendVal) {
						s.i = end + 1 - s.base
						return false, 0, nil
					}
					pendVal = -1
				} else if pendKey = false; keyIndex(keys, s.b[opened+1-s.base:end-s.base]) < 0 {
					f.expectKey = false
				} else { // one of keys: byte by byte from the key
					s.i = opened - s.base
					return false, opened + 1, nil
				}
			}
			str := prefixXor(quote) ^ inString // inside a string, its opening quote included
			inString = uint64(int64(str) >> 63)
			events := (open|close|comma)&^str | quote&str
			for m := events; m != 0; m &= m - 1 {
				j := bits.TrailingZeros64(m)
				switch c := p[j]; c {
				case '"': // a string starts
					opened = s.base + i + j
					if f.depth != 1 || !f.expectKey {
						break
					}
					// A key: read off the masks when it is not one of keys, or
					// is one whose value is a string (both possibly ending in
					// a later block: pendKey, pendVal); else byte by byte.
					end := quote &^ (2<<j - 1)
					if end == 0 { // the key ends in a later block
						pendKey = true
						break
					}
					k := bits.TrailingZeros64(end)
					want := keyIndex(keys, p[j+1:k])
					if want < 0 {
						f.expectKey = false
						break
					}
					if v := k + 2; v < len(p) && p[k+1] == ':' {
						if p[v] == '"' {
							f.expectKey = false
							if end := quote &^ (2<<v - 1); end != 0 {
								at[want] = span{s.base + i + v, s.base + i + bits.TrailingZeros64(end) + 1}
								if f.got(want) {
									s.i = at[want].end - s.base
									return false, 0, nil
								}
							} else { // the value ends in a later block
								pendVal = want
							}
							break
						} else if e := literalEnd(p, v, events&^(2<<v-1)); e > v {
							f.expectKey = false
							at[want] = span{s.base + i + v, s.base + i + e}
							if f.got(want) {
								s.i = i + e
								return false, 0, nil
							}
							break
						}
					}
					s.i = i + j
					return false, s.pos() + 1, nil
				case '{', '[':
					f.depth++
					f.expectKey = f.depth == 1 && c == '{'
				case ',':
					f.expectKey = f.depth == 1
				default: // '}', ']'
					if f.depth--; f.depth == 0 {
						s.i = i + j + 1
						return true, 0, nil
					}
				}
			}
			if p == &pad {
				s.i = len(b)
				return false, 0, errShape
			}
			i += 64
		}
		s.i = i
		if !s.more() {
			return false, 0, errShape
		}
	}
}

// literalEnd is the end of the number or literal (a run's ordinal) that
// starts at p[v], as the byte loop reads one: up to the next comma or
// closing bracket (the first of after, the block's later events), with no
// whitespace, quote or opening bracket before it; v when it is not that
// (the byte loop reads it then).
func literalEnd(p *[64]byte, v int, after uint64) int {
	switch p[v] {
	case '{', '[', '}', ']', ',', ':', ' ', '\t', '\n', '\r':
		return v
	}
	if after == 0 {
		return v
	}
	e := bits.TrailingZeros64(after)
	switch p[e] {
	case ',', '}', ']':
	default:
		return v
	}
	for _, c := range p[v:e] {
		switch c {
		case ' ', '\t', '\n', '\r':
			return v
		}
	}
	return e
}

// keyIndex is the index of key in keys, -1 when it is not there (without
// converting key).
func keyIndex(keys []string, key []byte) int {
	for k, name := range keys {
		if string(key) == name {
			return k
		}
	}
	return -1
}

// fieldsBytes is fields byte by byte from s.i (the loop fields was before
// fieldsMasked), until the object's end (done) or, once past the body
// position stop, until nothing is pending (no wanted value being read).
func (s *scanner) fieldsBytes(f *fieldState, keys []string, at []span, stop int) (done bool, err error) {
	depth, expectKey, want, lit := f.depth, f.expectKey, f.want, f.lit
	defer func() { f.depth, f.expectKey, f.want, f.lit = depth, expectKey, want, lit }()
	for {
		b, i := s.b, s.i
		for i < len(b) {
			if want < 0 && lit < 0 && s.base+i >= stop {
				s.i = i
				return false, nil
			}
			switch c := b[i]; c {
			case '"':
				start, plain := i, true
				if j := quoteOrEscape(b, i+1); j < len(b) && b[j] == '"' {
					i = j + 1
				} else {
					plain = false // long, escaped or cut by the window's end
					s.i = i
					at0 := s.pos()
					if err := s.skipString(); err != nil {
						return false, err
					}
					b, i = s.b, s.i
					start = at0 - s.base
				}
				if depth != 1 {
					continue
				}
				if lit >= 0 { // a number or literal run into a string: not JSON; take neither
					lit, want = -1, -1
				}
				if expectKey {
					expectKey, want = false, -1
					key := b[start+1 : i-1]
					if !plain && bytes.IndexByte(key, '\\') >= 0 {
						var u string
						if json.Unmarshal(b[start:i], &u) != nil {
							return false, errShape
						}
						key = []byte(u)
					}
					want = keyIndex(keys, key)
				} else if want >= 0 {
					at[want] = span{s.base + start, s.base + i}
					if f.got(want) {
						s.i, want = i, -1
						return false, nil
					}
					want = -1
				}
				continue
			case '{', '[':
				depth++
				expectKey = depth == 1 && c == '{'
				want, lit = -1, -1
			case '}', ']', ',', ' ', '\t', '\n', '\r':
				if lit >= 0 { // lit is only ever set at depth 1 for a wanted key
					at[want] = span{lit, s.base + i}
					if f.got(want) {
						s.i, lit, want = i, -1, -1
						return false, nil
					}
					lit, want = -1, -1
				}
				switch c {
				case ',':
					expectKey = depth == 1
				case '}', ']':
					depth--
					if depth == 0 {
						s.i = i + 1
						return true, nil
					}
				}
			case ':':
			default:
				if want >= 0 && lit < 0 && depth == 1 {
					lit = s.base + i
				}
			}
			i++
		}
		s.i = i
		if !s.more() {
			return false, errShape
		}
	}
}

// strAt is the string at sp (fields): its bytes, unescaped when it holds an
// escape, valid until the scan reads on; ok is false when sp is not a string.
func (s *scanner) strAt(sp span) (v []byte, ok bool, err error) {
	if sp.end == 0 {
		return nil, false, nil
	}
	quoted := s.in(sp)
	if quoted[0] != '"' {
		return nil, false, nil
	}
	v, err = unquote(quoted)
	return v, err == nil, err
}

// intAt is the integer at sp (fields); 0 for anything else.
func (s *scanner) intAt(sp span) int64 {
	if sp.end == 0 {
		return 0
	}
	v, err := strconv.ParseInt(string(s.in(sp)), 10, 64)
	if err != nil {
		return 0 // not an integer: the decoder of the output says so if it matters
	}
	return v
}

// skipFree is skip of a value nothing keeps (the parts of T3's projection no
// decoder here reads: attempts, nodes, …, most of a long thread's body): the
// window drops what the scan has passed instead of holding the value until
// its end. Held, the window grew by doubling to the largest such array (6 MB
// of nodes at 50,000 turn items), allocated afresh on every read: 16 MB per
// read.
func (s *scanner) skipFree() error {
	s.release()
	s.free = true
	err := s.skip()
	s.free = false
	s.release()
	return err
}

// skip moves past one value. Objects and arrays, where nearly all of the
// body is, are skipped 64 bytes at a time (skipContainer).
func (s *scanner) skip() error {
	s.ws()
	if s.i >= len(s.b) {
		return errShape
	}
	switch s.b[s.i] {
	case '"':
		return s.skipString()
	case '{', '[':
		return s.skipContainer()
	default:
		start := s.pos()
		for {
			for s.i < len(s.b) {
				switch s.b[s.i] {
				case ',', '}', ']', ' ', '\t', '\n', '\r':
					if s.pos() == start {
						return errShape
					}
					return nil
				case '"', '{', '[', ':':
					return errShape
				}
				s.i++
			}
			if !s.more() {
				break
			}
		}
		if s.pos() == start {
			return errShape
		}
		return nil
	}
}

// Windows of streamed bodies: up to keptWindows of at most maxKeptWindow are
// kept for good (a sync.Pool empties at every garbage collection, and a
// t3_thread call then grew a new buffer); a window grows past firstWindow
// only while one value to keep is larger.
var keptWindow = make(chan *[]byte, keptWindows)

const (
	keptWindows   = 2
	maxKeptWindow = 4 << 20
)

func getWindow() *[]byte {
	select {
	case b := <-keptWindow:
		return b
	default:
		b := make([]byte, 0, firstWindow)
		return &b
	}
}

func putWindow(b *[]byte) {
	if cap(*b) > maxKeptWindow {
		return
	}
	select {
	case keptWindow <- b:
	default:
	}
}
