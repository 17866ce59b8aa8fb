package t3fake

import (
	"strconv"
	"strings"
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

// encode renders one generated value to its wire bytes. Stream items are encoded once here and the
// bytes are shared by every subscriber, which keeps fan-out cheap under load.
func encode(v encoder) jx.Raw {
	var e jx.Encoder
	v.Encode(&e)
	return jx.Raw(e.Bytes())
}

// jsonString encodes s as a JSON string value, for the jx.Raw fields (defects, errors) that carry
// free-form JSON.
func jsonString(s string) jx.Raw {
	var e jx.Encoder
	e.Str(s)
	return jx.Raw(e.Bytes())
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
	return strings.NewReplacer("%", "%25", ":", "%3A").Replace(s)
}
