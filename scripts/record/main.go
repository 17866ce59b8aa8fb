// Command record drives a live T3 Code server through the connector's
// scenarios and writes the traffic in the fixture format of testdata/t3
// (see testdata/t3/README.md), with tokens and tickets redacted. It is the
// first step of the maintainer's loop after a T3 protocol bump:
//
//	go run ./scripts/record -url http://127.0.0.1:3773 -token-file ~/.t3-token -project my-repo -out /tmp/rec
//	# compare with testdata/t3, copy what changed, then: edit schema/ → make generate → make check
//
// The token needs orchestration:read and orchestration:operate. Scenarios:
// reads (descriptor, session, shell, projects, a missing thread), basic (create
// a thread, dispatch, wait for the run to settle), interrupt (dispatch a long
// task, interrupt it). Runs use the server's real provider, so they cost what
// a real run costs; -scenarios limits them.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// Exchange and Frame are the fixture format.
type Exchange struct {
	T               string            `json:"t"`
	Ms              int64             `json:"ms"`
	Method          string            `json:"method"`
	URL             string            `json:"url"`
	RequestHeaders  map[string]string `json:"requestHeaders"`
	RequestBody     string            `json:"requestBody"`
	Status          int               `json:"status"`
	ResponseHeaders map[string]string `json:"responseHeaders"`
	ResponseBody    string            `json:"responseBody"`
}

type Frame struct {
	T    string `json:"t"`
	Dir  string `json:"dir"`
	Data string `json:"data"`
}

type Recording struct {
	Description string     `json:"description"`
	RecordedAt  string     `json:"recordedAt"`
	Server      string     `json:"server"`
	Exchanges   []Exchange `json:"exchanges"`
	Frames      []Frame    `json:"frames,omitempty"`
}

// recorder collects one scenario's traffic and redacts secrets.
type recorder struct {
	mu      sync.Mutex
	rec     Recording
	secrets []string
	base    http.RoundTripper
}

func (r *recorder) redact(s string) string {
	r.mu.Lock()
	secrets := append([]string(nil), r.secrets...)
	r.mu.Unlock()
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "REDACTED")
		}
	}
	return s
}

func (r *recorder) addSecret(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secrets = append(r.secrets, s)
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := r.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	var rb []byte
	if resp.StatusCode != http.StatusSwitchingProtocols {
		// A 101's body is the WebSocket itself: leave it to the dialer.
		rb, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(rb))
	}
	// A ticket in a response is a secret from now on.
	var tk struct {
		Ticket string `json:"ticket"`
	}
	if json.Unmarshal(rb, &tk) == nil && tk.Ticket != "" {
		r.addSecret(tk.Ticket)
	}
	ex := Exchange{
		T: start.UTC().Format(time.RFC3339Nano), Ms: time.Since(start).Milliseconds(),
		Method: req.Method, URL: r.redact(req.URL.String()),
		RequestHeaders: headers(req.Header, r), RequestBody: r.redact(string(body)),
		Status: resp.StatusCode, ResponseHeaders: headers(resp.Header, r), ResponseBody: r.redact(string(rb)),
	}
	r.mu.Lock()
	r.rec.Exchanges = append(r.rec.Exchanges, ex)
	r.mu.Unlock()
	return resp, nil
}

func headers(h http.Header, r *recorder) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		lk := strings.ToLower(k)
		if lk == "authorization" {
			out[lk] = "Bearer REDACTED"
			continue
		}
		if lk == "cookie" || lk == "set-cookie" {
			out[lk] = "REDACTED"
			continue
		}
		out[lk] = r.redact(strings.Join(v, ", "))
	}
	return out
}

func (r *recorder) tap(dir string, data []byte) {
	f := Frame{T: time.Now().UTC().Format(time.RFC3339Nano), Dir: dir, Data: r.redact(string(data))}
	r.mu.Lock()
	r.rec.Frames = append(r.rec.Frames, f)
	r.mu.Unlock()
}

func main() {
	url := flag.String("url", "", "T3 server URL, e.g. http://127.0.0.1:3773")
	tokenFile := flag.String("token-file", "", "file holding a token with orchestration:read and orchestration:operate")
	project := flag.String("project", "", "project id or title to run threads in (reads only when empty)")
	out := flag.String("out", "", "output directory for the recordings")
	scenarios := flag.String("scenarios", "reads,basic,interrupt", "comma-separated scenarios")
	timeout := flag.Duration("timeout", 5*time.Minute, "per scenario")
	flag.Parse()
	if *url == "" || *tokenFile == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		fail(err)
	}
	token := strings.TrimSpace(string(tok))
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	for _, sc := range strings.Split(*scenarios, ",") {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		rec, err := runScenario(ctx, strings.TrimSpace(sc), *url, token, *project)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "scenario %s: %v\n", sc, err)
		}
		if rec == nil {
			continue
		}
		path := filepath.Join(*out, "live-"+sc+".json")
		b, _ := json.MarshalIndent(rec.rec, "", "  ")
		if bytes.Contains(b, []byte(token)) {
			fail(errors.New("refusing to write a recording that contains the token"))
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			fail(err)
		}
		fmt.Printf("wrote %s (%d exchanges, %d frames)\n", path, len(rec.rec.Exchanges), len(rec.rec.Frames))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "record:", err)
	os.Exit(1)
}

func runScenario(ctx context.Context, name, url, token, project string) (*recorder, error) {
	r := &recorder{base: http.DefaultTransport, secrets: []string{token}}
	r.rec = Recording{RecordedAt: time.Now().UTC().Format(time.RFC3339), Server: url}
	c, err := t3.NewClient("live", url, token, t3.Options{
		HTTPClient: &http.Client{Transport: r},
		RPC:        effectrpc.Options{Tap: r.tap},
	})
	if err != nil {
		return nil, err
	}
	d, err := c.Handshake(ctx)
	if err != nil {
		return r, err
	}
	r.rec.Server = fmt.Sprintf("T3 Code %s (protocol %d)", d.ServerVersion, d.Protocol)
	switch name {
	case "reads":
		r.rec.Description = "descriptor, session, shell, projects, a thread that does not exist"
		_, _ = c.Session(ctx)
		_, _ = c.Shell(ctx)
		_, _ = c.Projects(ctx)
		_, _ = c.Thread(ctx, "thread-does-not-exist")
		return r, nil
	case "basic", "interrupt":
		if project == "" {
			return nil, errors.New("needs -project")
		}
		return r, runThread(ctx, r, c, project, name)
	}
	return nil, fmt.Errorf("unknown scenario %q", name)
}

func runThread(ctx context.Context, r *recorder, c *t3.Client, projectRef, name string) error {
	projects, err := c.Projects(ctx)
	if err != nil {
		return err
	}
	var pid string
	for _, p := range projects {
		if p.ID == projectRef || p.Title == projectRef || p.WorkspaceRoot == projectRef {
			pid = p.ID
		}
	}
	if pid == "" {
		return fmt.Errorf("project %q not found", projectRef)
	}
	conn, err := c.DialRPC(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	cfg, err := c.GetConfig(ctx, conn)
	if err != nil {
		return err
	}
	var model t3rpc.ModelSelection
	for _, p := range cfg.Providers {
		if p.Enabled.Or(true) && p.Status.Or("ready") == "ready" && len(p.Models) > 0 {
			model = t3rpc.ModelSelection{InstanceId: p.InstanceId, Model: p.Models[0].Slug}
			break
		}
	}
	if model.InstanceId == "" {
		return errors.New("no usable provider on the server")
	}
	connect := func(context.Context) (*effectrpc.Conn, error) { return conn, nil }
	tid, msg := t3.NewID("thread"), t3.NewID("msg")
	prompt := "Reply with the word hello and nothing else."
	if name == "interrupt" {
		prompt = "Count slowly from 1 to 10000, one number per line, thinking about each."
	}
	r.rec.Description = fmt.Sprintf("%s: thread.create, subscribeThread, message.dispatch %q", name, prompt)
	states := make(chan string, 100)
	sctx, scancel := context.WithCancel(ctx)
	streamDone := make(chan struct{})
	defer func() {
		// The stream's goroutine writes frames into the recording (its Acks): the caller reads
		// the recording once this returns, so the goroutine ends first.
		scancel()
		<-streamDone
	}()
	go func() {
		defer close(streamDone)
		in := &t3rpc.SubscribeShellInput{RequestCompletionMarker: t3rpc.NewOptBool(true)}
		_ = conn.Stream(sctx, "orchestration.subscribeShell", in, func(values []jx.Raw) error {
			for _, v := range values {
				var it t3rpc.ShellStreamItem
				if it.Decode(jx.DecodeBytes(v)) == nil {
					if th, ok := it.Thread.Get(); ok && th.ID == tid {
						select {
						case states <- th.Status + "|" + threadstate.ActiveRun(&th):
						default:
						}
					}
				}
			}
			return nil
		})
	}()
	if _, err := t3.Dispatch(ctx, connect, t3.ThreadCreate(tid, pid, "t3code-mcp recording: "+name, model)); err != nil {
		return err
	}
	if _, err := t3.Dispatch(ctx, connect, t3.MessageDispatch(tid, msg, prompt, prompt)); err != nil {
		return err
	}
	interrupted := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case s := <-states:
			status, run, _ := strings.Cut(s, "|")
			if name == "interrupt" && !interrupted && status == "running" && run != "" {
				interrupted = true
				if _, err := t3.Dispatch(ctx, connect, t3.RunInterrupt(tid, run, "t3code-mcp recording")); err != nil {
					return err
				}
			}
			if _, done := threadstate.Settled(status); done {
				_, err := c.Thread(ctx, tid)
				return err
			}
		}
	}
}
