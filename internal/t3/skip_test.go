package t3

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// skipContainerTokens is the token loop skipContainer replaced (skip's
// object and array case until 12-02): strings skipped by quoteOrEscape and
// skipString, brackets outside them counted. The reference skipContainer is
// checked against, on a body held whole.
func skipContainerTokens(b []byte) (end int, ok bool) {
	s := scanner{b: b}
	depth := 0
	i := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			if j := quoteOrEscape(b, i+1); j < len(b) && b[j] == '"' {
				i = j + 1
				continue
			}
			s.i = i
			if s.skipString() != nil {
				return 0, false
			}
			i = s.i
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return 0, false
}

// skipStreamed is skipContainer of body arriving in pieces of the sizes in n
// through a window of window bytes at first that drops what the scan passed
// (skipFree); end is the body position after the container.
func skipStreamed(body []byte, window int, n ...int) (end int, ok bool) {
	s := scanner{b: make([]byte, 0, window), src: &source{r: &chunks{r: bytes.NewReader(body), n: n}}}
	s.more()
	if err := s.skipFree(); err != nil {
		return 0, false
	}
	return s.pos(), true
}

// streaming is how a body arrives: a first window and the sizes of the reads.
type streaming struct {
	window int
	reads  []int
}

// streamings are the ways checkSkip and checkFields stream a body: in pieces
// of a few bytes through small windows, and across the block size; a long
// body (a whole recorded one) only in larger pieces (TestTrimBoundedStreamed
// streams those whole bodies in every way).
func streamings(body []byte) []streaming {
	if len(body) > 4096 {
		return []streaming{{4096, []int{1000, 63, 65}}}
	}
	return []streaming{{1, []int{1}}, {16, []int{7, 1, 3}}, {100, []int{65, 130}}}
}

// checkSkip compares skipContainer with the token loop on body (which starts
// with a bracket): whole, and streamed in pieces through small windows.
func checkSkip(t *testing.T, body []byte) {
	t.Helper()
	eachMaskPath(func(path string) {
		t.Helper()
		checkSkipOn(t, path, body)
	})
}

// eachMaskPath runs f with the block masks made by vector compares
// (masks64, where the machine has them) and with the integer ones.
func eachMaskPath(f func(path string)) {
	vector := haveMasks64
	defer func() { haveMasks64 = vector }()
	if vector {
		f("vector")
	}
	haveMasks64 = false
	f("integer")
}

func checkSkipOn(t *testing.T, path string, body []byte) {
	t.Helper()
	wantEnd, wantOK := skipContainerTokens(body)
	s := scanner{b: body}
	err := s.skipContainer()
	if (err == nil) != wantOK || wantOK && s.i != wantEnd {
		t.Fatalf("%s masks, whole: end %d, %v; the token loop: end %d, %v; body %q", path, s.i, err, wantEnd, wantOK, body)
	}
	for _, c := range streamings(body) {
		end, ok := skipStreamed(body, c.window, c.reads...)
		if ok != wantOK || ok && end != wantEnd {
			t.Fatalf("%s masks, streamed (window %d, reads %v): end %d, %v; the token loop: end %d, %v; body %q", path, c.window, c.reads, end, ok, wantEnd, wantOK, body)
		}
	}
}

// skipContainer ends where the token loop ended, on T3's bodies and on
// bodies made to cross the 64-byte blocks with what changes the state:
// escapes (runs of backslashes, one ending a block), quotes, brackets inside
// strings, backslashes outside strings (not JSON), unclosed containers.
func TestSkipContainerEndsWhereTheTokenLoopEnded(t *testing.T) {
	for _, body := range append(fixtureBounded(t), bigBounded(t, 30, true), fakeBounded(t, 20)) {
		n := 0
		for i, c := range body {
			if c != '[' && c != '{' {
				continue
			}
			checkSkip(t, body[i:])
			if n++; n > 25 {
				break
			}
		}
	}
	atoms := []string{`"`, `\`, `\\`, `\"`, `{`, `}`, `[`, `]`, `"a[b"`, `"x\"y"`, `"\\"`, `:`, `,`, `1`, ` `, "\n", `"long string of text without anything special in it at all"`}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		var b bytes.Buffer
		b.WriteString([]string{"[", "{"}[r.IntN(2)])
		for range r.IntN(80) {
			b.WriteString(atoms[r.IntN(len(atoms))])
		}
		checkSkip(t, b.Bytes())
	}
	for pad := range 130 { // a backslash or a quote on every position of a block
		for _, tail := range []string{`\"]"]`, `\\"]`, `"]`, `\\\"]"]`} {
			body := fmt.Sprintf(`["%s%s`, bytes.Repeat([]byte("a"), pad), tail)
			checkSkip(t, []byte(body))
		}
	}
}

// FuzzSkipContainer: on any bytes, skipContainer ends where the token loop
// ended (or fails where it failed), whole and streamed.
func FuzzSkipContainer(f *testing.F) {
	for _, b := range fixtureBounded(f) {
		f.Add(b)
	}
	f.Add([]byte(`{"a":["x\\\"]",{"b":"\\"}],"c":1}`))
	f.Add([]byte(`[\"]"]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 || body[0] != '[' && body[0] != '{' {
			body = append([]byte{'['}, body...)
		}
		checkSkip(t, body)
	})
}

// The vector masks (masks64) are the integer ones (byteMask), on blocks
// dense in the bytes they flag and their neighbours.
func TestMasks64AreTheIntegerMasks(t *testing.T) {
	if !haveMasks64 {
		t.Skip("no vector masks on this machine")
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		var p [64]byte
		for k := range p {
			p[k] = []byte{'"', '\\', '{', '}', '[', ']', ',', 0x0c, 'y', 'Y', 0x7f, 0x5f, 0, 0xff, byte(r.IntN(256))}[r.IntN(15)]
		}
		q, b, o, c, m := masks64(&p)
		var wq, wb, wo, wc, wm uint64
		for k, x := range p {
			bit := uint64(1) << k
			switch x {
			case '"':
				wq |= bit
			case '\\':
				wb |= bit
			case '{', '[':
				wo |= bit
			case '}', ']':
				wc |= bit
			case ',':
				wm |= bit
			}
		}
		if q != wq || b != wb || o != wo || c != wc || m != wm {
			t.Fatalf("masks64(%q) = %x %x %x %x %x, want %x %x %x %x %x", p, q, b, o, c, m, wq, wb, wo, wc, wm)
		}
	}
}

func TestByteMaskIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		var p [8]byte
		for k := range p {
			p[k] = []byte{'"', '\\', 0, 0x80, 0xa2, 0x22, 0x21, 0x23, byte(r.IntN(256))}[r.IntN(9)]
		}
		x := uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24 | uint64(p[4])<<32 | uint64(p[5])<<40 | uint64(p[6])<<48 | uint64(p[7])<<56
		var want uint64
		for k, c := range p {
			if c == '"' {
				want |= 1 << k
			}
		}
		if got := byteMask(x, '"'); got != want {
			t.Fatalf("byteMask(%q) = %08b, want %08b", p, got, want)
		}
	}
}

// BenchmarkSkipContainer is the skip of a whole bounded body of 5,000 turn items (its outer
// object: every byte scanned), by blocks (skipContainer) and by tokens (the loop it replaced).
func BenchmarkSkipContainer(b *testing.B) {
	body := fakeBounded(b, 1_000)
	for _, impl := range []struct {
		name string
		skip func([]byte) (int, bool)
	}{{"blocks", func(body []byte) (int, bool) {
		s := scanner{b: body}
		err := s.skipContainer()
		return s.i, err == nil
	}}, {"tokens", skipContainerTokens}} {
		b.Run(impl.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if end, ok := impl.skip(body); !ok || end != len(body) {
					b.Fatalf("ended at %d of %d", end, len(body))
				}
			}
		})
	}
}

// fieldsByBytes is fields as it was before the block masks: byte by byte
// from the object's start (fieldsBytes with no stop), on a body held whole.
func fieldsByBytes(body []byte, keys []string, at []span) (end int, err error) {
	clear(at)
	s := scanner{b: body}
	if s.ws(); s.i >= len(s.b) || s.b[s.i] != '{' {
		return 0, errShape
	}
	f := fieldState{want: -1, lit: -1}
	for k, key := range keys {
		if key != "" {
			f.all |= 1 << k
		}
	}
	done, err := s.fieldsBytes(&f, keys, at, math.MaxInt)
	if err != nil {
		return 0, err
	}
	if !done { // every key has its value: the rest of the object as the token loop skips it
		end, ok := skipContainerTokens(append([]byte{'{'}, body[s.i:]...))
		if !ok {
			return 0, errShape
		}
		return s.i + end - 1, nil
	}
	return s.i, nil
}

// checkFields compares fields with the byte loop on body (which starts with
// '{'), for the keys of runs and of timeline rows: whole, and streamed in
// pieces through small windows, on both mask paths.
func checkFields(t *testing.T, body []byte) {
	t.Helper()
	for _, keys := range [][]string{runKeys[:], itemKeys[:], idRunKeys[:], requestKeys[:]} {
		want := make([]span, len(keys))
		wantEnd, wantErr := fieldsByBytes(body, keys, want)
		eachMaskPath(func(path string) {
			t.Helper()
			got := make([]span, len(keys))
			s := scanner{b: body}
			err := s.fields(keys, got)
			if (err == nil) != (wantErr == nil) || err == nil && (s.i != wantEnd || !slices.Equal(got, want)) {
				t.Fatalf("%s masks, keys %q, whole: end %d, %v, %v; the byte loop: end %d, %v, %v; body %q", path, keys, s.i, got, err, wantEnd, want, wantErr, body)
			}
			for _, c := range streamings(body) {
				s := scanner{b: make([]byte, 0, c.window), src: &source{r: &chunks{r: bytes.NewReader(body), n: c.reads}}}
				s.more()
				err := s.fields(keys, got)
				if (err == nil) != (wantErr == nil) || err == nil && (s.pos() != wantEnd || !slices.Equal(got, want)) {
					t.Fatalf("%s masks, keys %q, streamed (window %d, reads %v): end %d, %v, %v; the byte loop: end %d, %v, %v; body %q", path, keys, c.window, c.reads, s.pos(), got, err, wantEnd, want, wantErr, body)
				}
			}
		})
	}
}

// fields by the block masks finds what the byte loop found, and ends where
// it ended: on T3's objects (runs, checkpoints, messages, rows), and on
// objects made of what changes its state (keys and their values of every
// type, nesting, commas and brackets inside strings, escapes, whitespace,
// things that are not JSON) crossing the 64-byte blocks.
func TestFieldsFindWhatTheByteLoopFound(t *testing.T) {
	for _, body := range append(fixtureBounded(t), fakeBounded(t, 10)) {
		n := 0
		for i, c := range body {
			if c != '{' {
				continue
			}
			checkFields(t, body[i:])
			if n++; n > 20 {
				break
			}
		}
	}
	// Bodies that end inside a string going on past its block: a wanted value, a key, an
	// unwanted key (the byte loop fails on them: so must the masks).
	long := string(bytes.Repeat([]byte("p"), 100))
	for _, body := range []string{`{"id":"` + long, `{"` + long, `{"x":1,"` + long, `{"ordinal":2,"id":"r` + long} {
		checkFields(t, []byte(body))
	}
	atoms := []string{`"id"`, `"ordinal"`, `"runId"`, `"requestId"`, `"userMessageId"`, `:`, `,`, `{`, `}`, `[`, `]`, `"x,y}"`, `"a\"b"`, `"i\u0064"`, `12`, `true`, `null`, ` `, "\n", `x`, `"` + string(bytes.Repeat([]byte("p"), 70)) + `"`}
	r := rand.New(rand.NewPCG(7, 8))
	for range 1000 {
		var b bytes.Buffer
		b.WriteString("{")
		for range r.IntN(60) {
			b.WriteString(atoms[r.IntN(len(atoms))])
		}
		b.WriteString([]string{"}", "", "]}"}[r.IntN(3)])
		checkFields(t, b.Bytes())
	}
}

// fields stops looking at keys once every key it looks for has its value and
// skips the rest of the object: a key that comes again after that is not
// read (its first value is taken), and the object still ends at its closing
// bracket, whole and streamed in small windows, on both mask paths; a key it
// does not look for ("" in the keys) does not hold it back.
func TestFieldsStopOnceAllKeysFound(t *testing.T) {
	long := `"` + string(bytes.Repeat([]byte("p"), 70)) + `"`
	body := []byte(`{"id":"run-1","x":` + long + `,"runId":"r1","id":"run-2","runId":{"a":[1,"]}"]},"z":` + long + `}`)
	rest := []byte(`,"next":1`)
	eachMaskPath(func(path string) {
		for _, c := range append(streamings(body), streaming{window: len(body) + len(rest)}) {
			var s scanner
			if c.reads == nil {
				s = scanner{b: append(slices.Clip(body), rest...)}
			} else {
				s = scanner{b: make([]byte, 0, c.window), src: &source{r: &chunks{r: bytes.NewReader(append(slices.Clip(body), rest...)), n: c.reads}}}
				s.more()
			}
			var at [3]span
			if err := s.fields(idRunKeys[:], at[:]); err != nil {
				t.Fatalf("%s, %+v: %v", path, c, err)
			}
			id, _, _ := s.strAt(at[0])
			runID, _, _ := s.strAt(at[1])
			if string(id) != "run-1" || string(runID) != "r1" || s.pos() != len(body) {
				t.Fatalf("%s, %+v: id %q, runId %q, end %d; want run-1, r1, %d", path, c, id, runID, s.pos(), len(body))
			}
		}
	})
}

// FuzzFields: on any bytes, fields by the block masks finds what the byte
// loop found (or fails where it failed), whole and streamed.
func FuzzFields(f *testing.F) {
	f.Add([]byte(`{"id":"run-1","ordinal":3,"userMessageId":"m","status":"x"}`))
	f.Add([]byte(`{"runId" : "r", "requestId":null,"x":{"runId":"no"}}`))
	f.Add([]byte(`{"ordinal"::5,"id":1 ,"userMessageId":tru:e}`))
	for _, b := range fixtureBounded(f) {
		if i := bytes.Index(b, []byte(`"runs":[{`)); i >= 0 {
			f.Add(b[i+len(`"runs":[`):])
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 || body[0] != '{' {
			body = append([]byte{'{'}, body...)
		}
		checkFields(t, body)
	})
}
