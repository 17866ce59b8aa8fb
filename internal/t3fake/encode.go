package t3fake

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Small constructors for the generated optional types. They keep the record builders readable;
// the types themselves stay the generated ones.

func optStr(v string) t3rpc.OptString { return t3rpc.NewOptString(v) }

func optNilStr(v string) t3rpc.OptNilString { return t3rpc.NewOptNilString(v) }

// null is an explicit JSON null: T3 sends "not reached yet" fields as null, never absent.
func null() t3rpc.OptNilString { return t3rpc.OptNilString{Set: true, Null: true} }

// strOrNull is null for "" so that unset timestamps and ids read like T3's.
func strOrNull(v string) t3rpc.OptNilString {
	if v == "" {
		return null()
	}
	return optNilStr(v)
}

func optI64(v int64) t3rpc.OptInt64 { return t3rpc.NewOptInt64(v) }

// encoder is what every generated type has; Encode writes one JSON value.
type encoder interface{ Encode(e *jx.Encoder) }

// encoders reuses jx.Encoders and their buffers: an encoder that starts empty grows its buffer
// several times per value, which was a quarter of the fake's CPU under load (docs/benchmarks.md).
var encoders = sync.Pool{New: func() any { return &jx.Encoder{} }}

// maxPooledEncoder keeps a thread projection's multi-megabyte buffer out of the pool.
const maxPooledEncoder = 64 << 10

// withEncoder runs f on a pooled, empty encoder and returns a copy of what it wrote, sized exactly.
func withEncoder(f func(e *jx.Encoder)) jx.Raw {
	e := encoders.Get().(*jx.Encoder)
	e.Reset()
	f(e)
	out := jx.Raw(append(make([]byte, 0, len(e.Bytes())), e.Bytes()...))
	if cap(e.Bytes()) <= maxPooledEncoder {
		encoders.Put(e)
	}
	return out
}

// slab gives encoded stream items their bytes out of shared blocks: one allocation per block
// instead of one per item, and the item is encoded in place instead of copied out of a pooled
// encoder's buffer (under load that copy and its allocation cost more than the encoding). Used
// under Server.mu.
//
// Blocks are reused: a retired block waits in full until no reader can still hold one of its
// items (reusable: the log has dropped them and every shell subscriber's queue is past them),
// then takes new items. Writing rows into a block still warm in the cache instead of into fresh
// memory (zeroed, then faulted in or fetched cold) was most of a row's cost under load, and the
// harness allocated ~10 kB per run for rows (docs/benchmarks.md, "The harness's cost,
// evening"). Items go into blocks in sequence order, so a block is known by its newest item's
// sequence.
type slab struct {
	enc   jx.Encoder     // for items written with the generated encoders (shellItemFunc)
	buf   []byte         // the current block; its free part is buf[len(buf):cap(buf)]
	last  int64          // the sequence of the newest item written into buf
	full  []retiredBlock // retired blocks, oldest first, that a reader may still hold
	spare [][]byte       // free blocks, empty
	// reusable reports whether no reader can hold an item with a sequence up to last any more
	// (Server.slabReusable); nil: blocks are never reused.
	reusable func(last int64) bool
	reused   int64 // blocks reused, for tests
}

type retiredBlock struct {
	buf  []byte
	last int64
}

const (
	slabBlock   = 64 << 10 // a block's size
	slabMinFree = 4 << 10  // a block with less free space left is retired
	// maxSpareBlocks bounds the free blocks kept per server (768 KiB): the log frees about ten
	// at each of its trims.
	maxSpareBlocks = 12
)

// append writes the item with sequence seq with f, which appends it to the empty slice it is
// given, and returns its bytes, capacity trimmed so that nothing can append into the block.
func (sl *slab) append(seq int64, f func(buf []byte) []byte) jx.Raw {
	if cap(sl.buf)-len(sl.buf) < slabMinFree {
		sl.buf = sl.block()
	}
	start := len(sl.buf)
	free := sl.buf[start:cap(sl.buf)]
	out := f(free[:0])
	if len(out) > 0 && &out[0] == &free[0] { // written in place
		sl.buf = sl.buf[:start+len(out)]
		sl.last = seq
	}
	// Otherwise it outgrew the block (a snapshot, say) and append moved it to an allocation of
	// its own.
	return jx.Raw(out[:len(out):len(out)])
}

// block retires the current block and returns an empty one: one whose items no reader can hold
// any more if there is one, a new one otherwise. Retired blocks wait in full, oldest first,
// until they are free; free ones wait in spare, a few at most: the log drops its old items in
// bulk, and more blocks kept than the next few need would only hold memory the GC could have.
func (sl *slab) block() []byte {
	if sl.reusable == nil {
		return make([]byte, 0, slabBlock)
	}
	if cap(sl.buf) > 0 {
		sl.full = append(sl.full, retiredBlock{sl.buf, sl.last})
	}
	for len(sl.full) > 0 && sl.reusable(sl.full[0].last) {
		if len(sl.spare) < maxSpareBlocks {
			sl.spare = append(sl.spare, sl.full[0].buf[:0])
		}
		sl.full[0] = retiredBlock{}
		sl.full = sl.full[1:]
	}
	if n := len(sl.spare); n > 0 {
		b := sl.spare[n-1]
		sl.spare[n-1] = nil
		sl.spare = sl.spare[:n-1]
		sl.reused++
		return b
	}
	return make([]byte, 0, slabBlock)
}

// stopReuse makes the slab allocate every block from now on (Restart to a lower head: sequences
// no longer grow, so a block's newest sequence says nothing).
func (sl *slab) stopReuse() {
	sl.reusable, sl.full, sl.spare = nil, nil, nil
}

// encode renders one generated value to its wire bytes. Stream items are encoded once here and the
// bytes are shared by every subscriber, which keeps fan-out cheap under load.
func encode(v encoder) jx.Raw {
	return withEncoder(v.Encode)
}

// jsonString encodes s as a JSON string value, for the jx.Raw fields (defects, errors) that carry
// free-form JSON.
func jsonString(s string) jx.Raw {
	return withEncoder(func(e *jx.Encoder) { e.Str(s) })
}

// isoMillis is T3's timestamp format: UTC, milliseconds, Z.
const isoMillis = "2006-01-02T15:04:05.000Z"

func iso(t time.Time) string { return t.UTC().Format(isoMillis) }

// requestKey turns an Effect RPC request id (string or number, echoed verbatim) into a map key
// that cannot confuse "1" with 1.
func requestKey(id t3rpc.RequestId) string {
	if v, ok := id.GetInt64(); ok {
		return "n" + strconv.FormatInt(v, 10)
	}
	v, _ := id.GetString()
	return "s" + v
}

// excerpt is the first n runes of s with runs of whitespace folded to one space, so a reply quoting
// a multi-line prompt stays one readable line.
func excerpt(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) > n {
		return strings.TrimSpace(string(r[:n]))
	}
	return s
}

// pathEscapeColons mirrors how T3 nests one id inside another (run:thread:x:ordinal:1 becomes
// run%3Athread%3Ax%3Aordinal%3A1 inside a node or item id), so nested ids stay unambiguous.
func pathEscapeColons(s string) string {
	if !strings.ContainsAny(s, "%:") {
		return s
	}
	return colonEscaper.Replace(s)
}

// colonEscaper is built once: strings.NewReplacer compiles its table on first use, which per call
// was a tenth of the fake's CPU under load.
var colonEscaper = strings.NewReplacer("%", "%25", ":", "%3A")
