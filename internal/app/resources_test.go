package app_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// Threads as MCP resources: the template is listed, reading a thread gives
// the t3_thread view, a subscription gets notifications/resources/updated as
// the run asks, is answered and ends (pushed by the watcher), completion
// offers machines, allowlisted projects and their threads, and a thread of a
// project no allowlist admits can be neither read nor subscribed to. Both an
// older protocol and the SDK's newest get the notifications.
func TestThreadResources(t *testing.T) {
	for _, version := range []string{"2025-06-18", ""} {
		t.Run("protocol "+version, func(t *testing.T) { testThreadResources(t, version) })
	}
}

func testThreadResources(t *testing.T, version string) {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	api := fk.AddProject("api", "/srv/api")
	secret := fk.AddProject("secret", "/srv/secret")
	hidden := fk.AddThread(secret, "hidden", "idle")
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")

	updated := make(chan string, 100)
	mc := mcp.NewClient(&mcp.Implementation{Name: "push-agent", Version: "1"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updated <- r.Params.URI },
	})
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := &client{t: t, session: s}

	if caps := s.InitializeResult().Capabilities; caps.Resources == nil || !caps.Resources.Subscribe || caps.Completions == nil {
		t.Fatalf("capabilities = %+v", caps)
	}
	tpl, err := s.ListResourceTemplates(ctx, nil)
	if err != nil || len(tpl.ResourceTemplates) != 1 || tpl.ResourceTemplates[0].URITemplate != tools.ThreadURITemplate {
		t.Fatalf("templates = %+v, %v", tpl, err)
	}

	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "ask me a question"}), "thread_id")
	uri := tools.ThreadURI("mac", api, tid)
	read := func() map[string]any {
		t.Helper()
		res, err := s.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil || len(res.Contents) != 1 || res.Contents[0].MIMEType != "application/json" {
			t.Fatalf("read %s = %+v, %v", uri, res, err)
		}
		var st map[string]any
		if err := json.Unmarshal([]byte(res.Contents[0].Text), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := read(); st["thread_id"] != tid || str(st, "project", "id") != api {
		t.Fatalf("resource = %v", st)
	}
	if err := s.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	// Step the run until it asks: a notification comes, and the resource shows the question.
	awaitUpdate := func(what string, done func(map[string]any) bool) map[string]any {
		t.Helper()
		for {
			fk.StepAll()
			select {
			case u := <-updated:
				if u != uri {
					t.Fatalf("notification for %s, want %s", u, uri)
				}
				if st := read(); done(st) {
					return st
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no notifications/resources/updated for %s", what)
			}
		}
	}
	awaitUpdate("the question", func(st map[string]any) bool { return st["pending_question"] != nil })
	c.ok("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"scope": "Workspace", "checks": []string{"lint"}}})
	awaitUpdate("the end of the run", func(st map[string]any) bool { return st["status"] == "completed" })

	// Completion: machines, allowlisted projects, threads of a project.
	complete := func(arg, typed string, known map[string]string) []string {
		t.Helper()
		res, err := s.Complete(ctx, &mcp.CompleteParams{
			Ref:      &mcp.CompleteReference{Type: "ref/resource", URI: tools.ThreadURITemplate},
			Argument: mcp.CompleteParamsArgument{Name: arg, Value: typed},
			Context:  &mcp.CompleteContext{Arguments: known},
		})
		if err != nil {
			t.Fatal(err)
		}
		return res.Completion.Values
	}
	if got := complete("machine", "m", nil); !slices.Equal(got, []string{"mac"}) {
		t.Fatalf("machines = %v", got)
	}
	if got := complete("project", "", map[string]string{"machine": "mac"}); !slices.Equal(got, []string{api}) {
		t.Fatalf("projects = %v (secret must not show)", got)
	}
	if got := complete("thread", "", map[string]string{"machine": "mac", "project": api}); !slices.Equal(got, []string{tid}) {
		t.Fatalf("threads = %v", got)
	}

	// Not allowlisted: not found, for reading and subscribing alike; so is a
	// URI naming the wrong project.
	for _, bad := range []string{tools.ThreadURI("mac", secret, hidden), tools.ThreadURI("mac", secret, tid), "t3code://threads/mac/" + api} {
		if _, err := s.ReadResource(ctx, &mcp.ReadResourceParams{URI: bad}); err == nil {
			t.Errorf("read %s succeeded", bad)
		}
		if err := s.Subscribe(ctx, &mcp.SubscribeParams{URI: bad}); err == nil {
			t.Errorf("subscribe %s succeeded", bad)
		}
	}
	if err := s.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
}

// Subscriptions are per session: two sessions subscribe to one thread (the
// second with another spelling of its URI), the first unsubscribes twice, a
// third subscribes and goes away without unsubscribing — and the second
// still gets each update, under the URI it subscribed with, while the gone
// session's subscription is pruned.
func TestThreadResourceSubscriptionsPerSession(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	api := fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func(updated chan string) *mcp.ClientSession {
		t.Helper()
		mc := mcp.NewClient(&mcp.Implementation{Name: "push-agent", Version: "1"}, &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
				if updated != nil {
					updated <- r.Params.URI
				}
			},
		})
		s, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, c := connect(nil), connect(nil)
	defer a.Close()
	bUpdates := make(chan string, 100)
	b := connect(bUpdates)
	defer b.Close()

	tid := str((&client{t: t, session: a}).ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "ask me a question"}), "thread_id")
	uri := tools.ThreadURI("mac", api, tid)
	bURI := "t3code://threads/mac/" + api + "/" + strings.Replace(tid, "-", "%2D", 1) // the same thread, spelled otherwise
	for _, sub := range []struct {
		s   *mcp.ClientSession
		uri string
	}{{a, uri}, {b, bURI}, {c, uri}} {
		if err := sub.s.Subscribe(ctx, &mcp.SubscribeParams{URI: sub.uri}); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.app.Push.Subscriptions(); n != 3 {
		t.Fatalf("subscriptions = %d, want 3", n)
	}
	for range 2 {
		if err := a.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The run moves until it asks: b hears of it, under its own URI, and by
	// then the closed session's subscription is gone.
	for asked := false; !asked; {
		fk.StepAll()
		select {
		case u := <-bUpdates:
			if u != bURI {
				t.Fatalf("b was notified under %s, want %s", u, bURI)
			}
			res, err := b.ReadResource(ctx, &mcp.ReadResourceParams{URI: bURI})
			if err != nil {
				t.Fatal(err)
			}
			asked = strings.Contains(res.Contents[0].Text, `"pending_question"`)
		case <-ctx.Done():
			t.Fatal("b got no notifications/resources/updated after a unsubscribed twice and c left")
		}
	}
	if n := h.app.Push.Subscriptions(); n != 1 {
		t.Fatalf("subscriptions = %d, want 1 (b's)", n)
	}
}
