package t3

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/go-faster/jx"
)

// servedBounded is a client of a server on 127.0.0.1 that answers every GET
// with body (chunked, as T3 sends it).
func servedBounded(t *testing.T, body func() []byte) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body())
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient("vm", srv.URL, "tok", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The recorder decodes a trimmed answer from its pooled buffer, which the
// next read reuses: what a read returned stays as it was while other threads
// are read after it (no decoded string or raw value points into the buffer).
func TestThreadRecentKeepResultOutlivesItsBuffer(t *testing.T) {
	first, other := fakeBounded(t, 7), fakeBounded(t, 9)
	body := first
	c := servedBounded(t, func() []byte { return body })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := c.ThreadRecentKeep(ctx, "thread-1", Keep{Runs: 3})
	if err != nil {
		t.Fatal(err)
	}
	encode := func() []byte {
		var e jx.Encoder
		rec.Projection.Encode(&e)
		return bytes.Clone(e.Bytes())
	}
	before := encode()
	if rec.RunCount != 7 || len(rec.Projection.Runs) != 3 || len(rec.Projection.Messages) == 0 {
		t.Fatalf("first read: %d runs counted, %d kept, %d messages", rec.RunCount, len(rec.Projection.Runs), len(rec.Projection.Messages))
	}
	body = other
	for range 5 {
		if r, err := c.ThreadRecentKeep(ctx, "thread-1", Keep{Runs: 3}); err != nil || r.RunCount != 9 {
			t.Fatalf("other read: %v, %d runs", err, r.RunCount)
		}
	}
	if after := encode(); !bytes.Equal(before, after) {
		t.Fatalf("the first read's projection changed under later reads:\nbefore %s\nafter  %s", before, after)
	}
}

// A trimmed answer the recorder cannot decode (here: a snapshotSequence that
// is not a number, which the trim passes through) is still decoded by the
// generated client, whose error says what T3 sent: a bad-response error, as
// before the recorder decoded trimmed answers itself.
func TestThreadRecentKeepUndecodableTrimmedAnswer(t *testing.T) {
	good := fakeBounded(t, 4)
	seq := regexp.MustCompile(`"snapshotSequence":[0-9]+`)
	if !seq.Match(good) {
		t.Fatal("the fake's bounded body has no snapshotSequence")
	}
	bad := seq.ReplaceAll(good, []byte(`"snapshotSequence":"soon"`))
	if _, _, err := trimBoundedFrom(bytes.NewReader(bad), Keep{Runs: 3}, 0, nil); err != nil {
		t.Fatalf("the trim refused the body (%v): the test needs one it passes", err)
	}
	c := servedBounded(t, func() []byte { return bad })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.ThreadRecentKeep(ctx, "thread-1", Keep{Runs: 3})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBadResponse || e.Status != http.StatusOK || errors.Is(err, errDecoded) {
		t.Fatalf("got %v (%#v), want a bad-response error of the bounded read", err, e)
	}
	// And the good body still reads (the same client, after the failure).
	c = servedBounded(t, func() []byte { return good })
	if rec, err := c.ThreadRecentKeep(ctx, "thread-1", Keep{Runs: 3}); err != nil || rec.RunCount != 4 || len(rec.Projection.Runs) != 3 {
		t.Fatalf("good body: %v %+v", err, rec)
	}
}
