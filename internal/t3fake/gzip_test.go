package t3fake

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// rawClient leaves Accept-Encoding and the body as they are (no transparent inflate), so the
// test sees what the fake sent.
var rawClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}

type rawAnswer struct {
	status   int
	encoding string
	vary     string
	body     []byte // as sent
}

func rawGet(t *testing.T, u, tok, acceptEncoding string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("x-t3-orchestration-protocol", "2")
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	res, err := rawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawAnswer{status: res.StatusCode, encoding: res.Header.Get("Content-Encoding"), vary: res.Header.Get("Vary"), body: b}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gzip body: %v", err)
	}
	return out
}

// The fake answers its HTTP reads gzipped when the request accepts gzip and the body is at least
// gzipThreshold long, as T3 does (the recordings: shell and thread reads gzipped, the small
// bodies plain, Vary: Accept-Encoding on all), and plain otherwise; the gzipped body inflates to
// the plain one byte for byte.
func TestHTTPAnswersGzippedWhenAsked(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 4})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "gzip", "idle")
	for i := range 4 {
		if _, err := s.StartRun(tid, fmt.Sprintf("attempt %d", i+1)); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
	}
	tok := s.Token()
	thread := s.URL() + "/api/orchestration/threads/" + url.PathEscape(tid)
	bounded := rawGet(t, thread+"/bounded", tok, "identity")
	cursor := string(bytes.Split(bytes.Split(bounded.body, []byte(`"historyCursor":"`))[1], []byte(`"`))[0])

	large := map[string]string{
		"shell":   s.URL() + "/api/orchestration/shell",
		"thread":  thread,
		"bounded": thread + "/bounded",
		"history": thread + "/history?cursor=" + url.QueryEscape(cursor),
	}
	small := map[string]string{
		"descriptor": s.URL() + "/.well-known/t3/environment",
		"session":    s.URL() + "/api/auth/session",
		"projects":   s.URL() + "/api/projects",
	}
	asks := []string{"gzip", "gzip, deflate, br", "br;q=1.0, gzip;q=0.5", "GZIP"}
	refusals := []string{"", "identity", "gzip;q=0", "deflate, br", "*"} // a bare * is not taken as gzip (gzip.go)
	for name, u := range large {
		plain := rawGet(t, u, tok, "identity")
		if plain.status != http.StatusOK || plain.encoding != "" || len(plain.body) < gzipThreshold {
			t.Fatalf("%s plain: %d %q, %d bytes", name, plain.status, plain.encoding, len(plain.body))
		}
		if plain.vary != "Accept-Encoding" {
			t.Errorf("%s plain: Vary %q", name, plain.vary)
		}
		for _, ae := range asks {
			gz := rawGet(t, u, tok, ae)
			if gz.status != http.StatusOK || gz.encoding != "gzip" || gz.vary != "Accept-Encoding" {
				t.Fatalf("%s, Accept-Encoding %q: %d, Content-Encoding %q, Vary %q", name, ae, gz.status, gz.encoding, gz.vary)
			}
			if len(gz.body) >= len(plain.body) {
				t.Errorf("%s: gzipped %d bytes, plain %d", name, len(gz.body), len(plain.body))
			}
			if got := gunzip(t, gz.body); !bytes.Equal(got, plain.body) {
				t.Fatalf("%s: the gzipped body inflates to\n%s\nnot\n%s", name, got, plain.body)
			}
		}
		for _, ae := range refusals {
			if a := rawGet(t, u, tok, ae); a.encoding != "" || !bytes.Equal(a.body, plain.body) {
				t.Errorf("%s, Accept-Encoding %q: Content-Encoding %q, body equal %v", name, ae, a.encoding, bytes.Equal(a.body, plain.body))
			}
		}
	}
	for name, u := range small {
		// (Their bodies carry the clock's time: not compared byte for byte.)
		a := rawGet(t, u, tok, "gzip")
		if a.status != http.StatusOK || a.encoding != "" || !json.Valid(a.body) || len(a.body) >= gzipThreshold || a.vary != "Accept-Encoding" {
			t.Errorf("%s, asked for gzip: %d, Content-Encoding %q, Vary %q, %d bytes: %s", name, a.status, a.encoding, a.vary, len(a.body), a.body)
		}
	}
	// Error answers keep their status and body (small: plain).
	if a := rawGet(t, s.URL()+"/api/orchestration/shell", "", "gzip"); a.status != http.StatusUnauthorized || a.encoding != "" || !strings.Contains(string(a.body), "missing_credential") {
		t.Errorf("401 asked for gzip: %d %q %s", a.status, a.encoding, a.body)
	}
	if a := rawGet(t, s.URL()+"/api/orchestration/snapshot", tok, "gzip"); a.status != http.StatusServiceUnavailable || a.encoding != "" || !strings.HasPrefix(string(a.body), "No static directory") {
		t.Errorf("a route T3 does not have, asked for gzip: %d %q %s", a.status, a.encoding, a.body)
	}
}

// A hung read that ends without an answer (the client gave up) writes nothing, gzip asked or not.
func TestGzipAnswerWithoutBody(t *testing.T) {
	ask := httptest.NewRequest(http.MethodGet, "/api/orchestration/shell", nil)
	ask.Header.Set("Accept-Encoding", "gzip")
	rec := &headerRecorder{header: http.Header{}}
	gzipAnswers(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, ask)
	if rec.status != 0 || rec.body.Len() != 0 {
		t.Errorf("nothing written: status %d, %d bytes", rec.status, rec.body.Len())
	}
	// A body written in small pieces that reach the threshold together is gzipped whole.
	rec = &headerRecorder{header: http.Header{}}
	want := bytes.Repeat([]byte("0123456789abcdef"), gzipThreshold/16+3)
	gzipAnswers(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		for p := range slices.Chunk(want, 100) {
			if _, err := w.Write(p); err != nil {
				t.Error(err)
			}
		}
	})).ServeHTTP(rec, ask)
	if rec.status != http.StatusCreated || rec.header.Get("Content-Encoding") != "gzip" || !bytes.Equal(gunzip(t, rec.body.Bytes()), want) {
		t.Errorf("pieces: status %d, Content-Encoding %q", rec.status, rec.header.Get("Content-Encoding"))
	}
}

type headerRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *headerRecorder) Header() http.Header { return r.header }
func (r *headerRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *headerRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
