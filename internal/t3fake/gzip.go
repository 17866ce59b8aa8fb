package t3fake

import (
	"compress/gzip"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// HTTP answers gzipped as T3 sends them. Every HTTP answer of the recordings carries
// `Vary: Accept-Encoding`; the larger ones (shell 3.5-7.7 kB, thread reads 14-24 kB) came with
// `Content-Encoding: gzip`, the small ones (at most 463 bytes: descriptor, session, tickets,
// projects, error bodies) plain. So the fake gzips an answer when the request accepts gzip and
// the body reaches gzipThreshold (1 KiB: the usual threshold of Node's compression middlewares;
// the recordings place T3's between 463 bytes and 3.5 kB), and sends it plain otherwise. Go's
// transport asks for gzip by default; the connector asks loopback machines for `identity`
// unless its machine's `compression` is "gzip".

// gzipThreshold is the smallest body the fake gzips.
const gzipThreshold = 1024

var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// acceptsGzip reports whether an Accept-Encoding header admits gzip: a "gzip" (or "*") coding
// whose q is not 0.
func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(part, ";")
		coding = strings.TrimSpace(coding)
		if !strings.EqualFold(coding, "gzip") && coding != "*" {
			continue
		}
		if q, found := strings.CutPrefix(strings.TrimSpace(params), "q="); found {
			if v, err := strconv.ParseFloat(strings.TrimSpace(q), 64); err == nil && v == 0 {
				continue
			}
		}
		return true
	}
	return false
}

// gzipAnswer holds an answer's status and its first bytes until it knows whether the body
// reaches gzipThreshold: then it compresses, else finish sends it plain. The fake's handlers
// write a body in one Write, so nothing large is copied.
type gzipAnswer struct {
	w      http.ResponseWriter
	status int
	held   []byte
	gz     *gzip.Writer
	sent   bool // the header is written
}

func (a *gzipAnswer) Header() http.Header { return a.w.Header() }

func (a *gzipAnswer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *gzipAnswer) Write(p []byte) (int, error) {
	if a.gz != nil {
		return a.gz.Write(p)
	}
	if a.sent { // a body-less status (see finish) or a plain body already begun
		return a.w.Write(p)
	}
	if len(a.held)+len(p) < gzipThreshold {
		a.held = append(a.held, p...)
		return len(p), nil
	}
	h := a.w.Header()
	h.Set("Content-Encoding", "gzip")
	h.Del("Content-Length")
	a.w.WriteHeader(a.statusOr200())
	a.sent = true
	a.gz = gzipWriters.Get().(*gzip.Writer)
	a.gz.Reset(a.w)
	if len(a.held) > 0 {
		if _, err := a.gz.Write(a.held); err != nil {
			return 0, err
		}
	}
	return a.gz.Write(p)
}

func (a *gzipAnswer) statusOr200() int {
	if a.status == 0 {
		return http.StatusOK
	}
	return a.status
}

// finish ends the answer: closes the gzip stream, or sends what was held, plain.
func (a *gzipAnswer) finish() {
	if a.gz != nil {
		_ = a.gz.Close()
		a.gz.Reset(nil)
		gzipWriters.Put(a.gz)
		a.gz = nil
		return
	}
	if a.sent || (a.status == 0 && len(a.held) == 0) {
		return // nothing written: net/http's own default answer
	}
	a.w.WriteHeader(a.statusOr200())
	a.sent = true
	if len(a.held) > 0 {
		_, _ = a.w.Write(a.held)
	}
}
