package t3fake

import (
	"net/http"

	"github.com/klauspost/compress/gzhttp"
)

// HTTP answers gzipped as T3 sends them. Every HTTP answer of the recordings carries
// `Vary: Accept-Encoding`; the larger ones (shell 3.5-7.7 kB, thread reads 14-24 kB) came with
// `Content-Encoding: gzip`, the small ones (at most 463 bytes: descriptor, session, tickets,
// projects, error bodies) plain. So the fake gzips an answer when the request accepts gzip and
// the body reaches gzipThreshold (1 KiB: the usual threshold of Node's compression middlewares;
// the recordings place T3's between 463 bytes and 3.5 kB), and sends it plain otherwise. Go's
// transport asks for gzip by default; the connector asks loopback machines for `identity`
// unless its machine's `compression` is "gzip".
//
// The wrapper is klauspost/compress's gzhttp (it sets the Vary header, reads Accept-Encoding and
// its q-values, holds a body until it knows its size); zstd, which the recordings never show, is
// off. A bare `*` in Accept-Encoding is not taken as gzip.

// gzipThreshold is the smallest body the fake gzips.
const gzipThreshold = 1024

// gzipAnswers wraps a route's handler so that it answers as above.
var gzipAnswers = func() func(http.Handler) http.HandlerFunc {
	wrap, err := gzhttp.NewWrapper(gzhttp.MinSize(gzipThreshold), gzhttp.EnableZstd(false))
	if err != nil {
		panic(err) // fixed options: a library change that refuses them is a programming error
	}
	return wrap
}()
