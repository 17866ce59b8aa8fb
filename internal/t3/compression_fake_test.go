package t3_test

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// countingTransport counts the answers that came gzipped (and that the
// transport inflated: Response.Uncompressed) and those that came plain.
type countingTransport struct {
	rt            http.RoundTripper
	gzipped       atomic.Int64
	plain         atomic.Int64
	askedIdentity atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Accept-Encoding") == "identity" {
		c.askedIdentity.Add(1)
	}
	res, err := c.rt.RoundTrip(req)
	if err == nil {
		if res.Uncompressed {
			c.gzipped.Add(1)
		} else {
			c.plain.Add(1)
		}
	}
	return res, err
}

// A client with compression = "gzip" reads the fake T3, which gzips its larger
// answers when asked as T3 does, and decodes exactly what a client with
// compression = "none" decodes from the same, unchanged machine: shell, whole
// thread, bounded read (whole and trimmed to a Keep, with history left out)
// and the project list.
func TestCompressionGzipReadsTheFake(t *testing.T) {
	fk, err := t3fake.New(t3fake.Options{ManualSteps: true, HistoryPage: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fk.Close)
	pid := fk.AddProject("api", "/src/api")
	tid := fk.AddThread(pid, "many runs", "idle")
	for i := range 6 {
		if _, err := fk.StartRun(tid, fmt.Sprintf("attempt %d", i+1)); err != nil {
			t.Fatal(err)
		}
		fk.StepAll()
	}

	type reads struct {
		shell, thread, recent, kept, projects any
	}
	read := func(compression string) (reads, *countingTransport) {
		t.Helper()
		ct := &countingTransport{rt: &http.Transport{DisableKeepAlives: true}}
		c, err := t3.NewClient("fake", fk.URL(), fk.Token(), t3.Options{Compression: compression, HTTPClient: &http.Client{Transport: ct}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var r reads
		must := func(v any, err error) any {
			t.Helper()
			if err != nil {
				t.Fatalf("compression %q: %v", compression, err)
			}
			return v
		}
		r.shell = must(c.Shell(ctx))
		r.thread = must(c.Thread(ctx, tid))
		recent, err := c.ThreadRecent(ctx, tid)
		r.recent = must(recent, err)
		r.kept = must(c.ThreadRecentKeep(ctx, tid, t3.Keep{Runs: 2}))
		if !recent.HasMoreHistory {
			t.Fatalf("compression %q: the bounded read holds the whole thread; the test wants it bounded", compression)
		}
		r.projects = must(c.Projects(ctx))
		full := must(c.Thread(ctx, tid))
		if !reflect.DeepEqual(full, r.thread) {
			t.Fatalf("compression %q: the thread changed between reads", compression)
		}
		return r, ct
	}
	gz, gzT := read("gzip")
	plain, plainT := read("none")

	if !reflect.DeepEqual(gz, plain) {
		t.Fatalf("gzip and plain reads decode differently:\ngzip  %+v\nplain %+v", gz, plain)
	}
	// shell, thread, bounded, bounded trimmed, thread: all above the fake's threshold.
	if n := gzT.gzipped.Load(); n < 5 {
		t.Errorf("compression gzip: %d answers came gzipped (plain %d), want at least 5", n, gzT.plain.Load())
	}
	if gzT.askedIdentity.Load() != 0 {
		t.Errorf("compression gzip asked for identity %d times", gzT.askedIdentity.Load())
	}
	if n := plainT.gzipped.Load(); n != 0 || plainT.askedIdentity.Load() == 0 {
		t.Errorf("compression none: %d answers gzipped, %d asked identity", n, plainT.askedIdentity.Load())
	}
}
