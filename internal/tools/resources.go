package tools

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// Threads as MCP resources, for clients that keep a session open: one
// template, reading a thread gives the t3_thread view (JSON), and a
// subscription to a thread's URI gets notifications/resources/updated when
// the thread moves (a run starts, ends, asks or is answered, the thread is
// archived) — pushed from the machine's watcher, never polled.

// ThreadURITemplate names a thread: machine, project id, thread id.
const ThreadURITemplate = "t3code://threads/{machine}/{project}/{thread}"

const threadURIPrefix = "t3code://threads/"

// ThreadURI is the resource URI of a thread.
func ThreadURI(machine, projectID, threadID string) string {
	return threadURIPrefix + url.PathEscape(machine) + "/" + url.PathEscape(projectID) + "/" + url.PathEscape(threadID)
}

func parseThreadURI(uri string) (machine, projectID, threadID string, ok bool) {
	rest, found := strings.CutPrefix(uri, threadURIPrefix)
	parts := strings.Split(rest, "/")
	if !found || len(parts) != 3 {
		return "", "", "", false
	}
	var err error
	for i, p := range parts {
		if parts[i], err = url.PathUnescape(p); err != nil || parts[i] == "" {
			return "", "", "", false
		}
	}
	return parts[0], parts[1], parts[2], true
}

// maxSubscribed bounds how many thread URIs can be subscribed at once (all
// sessions together).
const maxSubscribed = 10_000

// Push turns watcher changes into notifications/resources/updated for the
// subscribed threads. It is a watch.Sink (chained after the event detector)
// that only compares and queues, so the watcher's Ack never waits on a
// client; Run delivers.
type Push struct {
	mu      sync.Mutex
	subs    map[string]*subscribed // thread key (machine + "\x00" + thread id) → subscription
	pending map[string]bool        // URIs to notify
	wake    chan struct{}
	srv     *mcp.Server
}

// subscribed is one thread's subscriptions: per MCP session, the URI it
// subscribed with (the SDK notifies a session only under that exact string,
// and two spellings of one thread's URI are one thread here).
type subscribed struct {
	sessions map[string]string // session id → URI
	state    string            // what the last notification (or the subscription) saw
}

func (s *subscribed) queue(pending map[string]bool) {
	for _, uri := range s.sessions {
		pending[uri] = true
	}
}

// NewPush makes an idle Push; Bind gives it the server to notify through.
func NewPush() *Push {
	return &Push{subs: map[string]*subscribed{}, pending: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Bind sets the MCP server the notifications go out through.
func (p *Push) Bind(s *mcp.Server) {
	p.mu.Lock()
	p.srv = s
	p.mu.Unlock()
}

func subKey(machine, threadID string) string { return machine + "\x00" + threadID }

// rowState is what a notification is about: a change of status, run
// pointers or pending request (the moves events are made of).
func rowState(t *t3rpc.ThreadShell) string {
	pending := ""
	if pr, ok := threadstate.PendingRequest(t); ok {
		pending = pr.ID
	}
	return strings.Join([]string{t.Status, threadstate.LatestRun(t), threadstate.ActiveRun(t), pending}, "\x00")
}

// Apply implements watch.Sink.
func (p *Push) Apply(_ context.Context, c watch.Change) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.subs) == 0 {
		return nil
	}
	queued := false
	for _, t := range c.Threads {
		s := p.subs[subKey(c.Machine, t.ID)]
		if s == nil {
			continue
		}
		if st := rowState(t); st != s.state {
			s.state = st
			s.queue(p.pending)
			queued = true
		}
	}
	for _, id := range c.Removed {
		if s := p.subs[subKey(c.Machine, id)]; s != nil && s.state != "removed" {
			s.state = "removed"
			s.queue(p.pending)
			queued = true
		}
	}
	if queued {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// ApplyQuick implements watch.QuickSink: Apply never waits (it queues the notifications for Run).
func (p *Push) ApplyQuick(c watch.Change) bool {
	_ = p.Apply(context.Background(), c)
	return true
}

// Run delivers queued notifications until ctx ends.
func (p *Push) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		srv := p.srv
		p.mu.Unlock()
		if srv == nil {
			continue
		}
		p.prune(srv)
		p.mu.Lock()
		uris := make([]string, 0, len(p.pending))
		for u := range p.pending {
			uris = append(uris, u)
		}
		clear(p.pending)
		p.mu.Unlock()
		sort.Strings(uris)
		for _, u := range uris {
			_ = srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: u})
		}
	}
}

// prune drops the subscriptions of sessions that are gone (closed or timed
// out without unsubscribing), so they neither hold a thread's subscription
// open nor count against maxSubscribed.
func (p *Push) prune(srv *mcp.Server) {
	live := map[string]bool{}
	for ss := range srv.Sessions() {
		live[ss.ID()] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, s := range p.subs {
		for id := range s.sessions {
			if !live[id] {
				delete(s.sessions, id)
			}
		}
		if len(s.sessions) == 0 {
			delete(p.subs, k)
		}
	}
}

// Subscriptions is how many (thread, session) subscriptions are held.
func (p *Push) Subscriptions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.subs {
		n += len(s.sessions)
	}
	return n
}

func (p *Push) subscribe(machine, threadID, session, uri string, shell *t3rpc.ThreadShell) error {
	p.mu.Lock()
	srv := p.srv
	full := len(p.subs) >= maxSubscribed && p.subs[subKey(machine, threadID)] == nil
	p.mu.Unlock()
	if full && srv != nil {
		p.prune(srv)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := subKey(machine, threadID)
	s := p.subs[k]
	if s == nil {
		if len(p.subs) >= maxSubscribed {
			return fmt.Errorf("resources/subscribe: %d threads are subscribed already, the most this connector follows; unsubscribe from some first", maxSubscribed)
		}
		s = &subscribed{sessions: map[string]string{}, state: rowState(shell)}
		p.subs[k] = s
	}
	s.sessions[session] = uri
	return nil
}

// unsubscribe ends one session's subscription to a thread; the others' stay.
func (p *Push) unsubscribe(machine, threadID, session string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := subKey(machine, threadID)
	if s := p.subs[k]; s != nil {
		delete(s.sessions, session)
		if len(s.sessions) == 0 {
			delete(p.subs, k)
		}
	}
}

// sessionID is the calling session's id ("" for a session without one: stdio).
func sessionID(ss *mcp.ServerSession) string {
	if ss == nil {
		return ""
	}
	return ss.ID()
}

// findURI resolves a thread URI to the thread, with the allowlist applied
// (Fleet.Thread): a URI whose machine or project does not match the thread's
// is not found.
func (d *Deps) findURI(uri string) (fleet.Found, error) {
	machine, project, thread, ok := parseThreadURI(uri)
	if !ok {
		return fleet.Found{}, mcp.ResourceNotFoundError(uri)
	}
	f, err := d.Fleet.Thread(thread)
	if err != nil || f.Machine.Name != machine || f.Project.ID != project {
		return fleet.Found{}, mcp.ResourceNotFoundError(uri)
	}
	return f, nil
}

// ServerOptions adds the subscription and completion handlers to o; call
// before mcp.NewServer, then RegisterResources.
func (d *Deps) ServerOptions(o *mcp.ServerOptions) {
	if d.Push == nil {
		return
	}
	o.SubscribeHandler = func(_ context.Context, req *mcp.SubscribeRequest) error {
		f, err := d.findURI(req.Params.URI)
		if err != nil {
			return err
		}
		// Notified under the URI as the client wrote it: the SDK matches it to
		// the session by that exact string.
		return d.Push.subscribe(f.Machine.Name, f.Shell.ID, sessionID(req.Session), req.Params.URI, &f.Shell)
	}
	o.UnsubscribeHandler = func(_ context.Context, req *mcp.UnsubscribeRequest) error {
		if machine, _, thread, ok := parseThreadURI(req.Params.URI); ok {
			d.Push.unsubscribe(machine, thread, sessionID(req.Session))
		}
		return nil
	}
	o.CompletionHandler = d.complete
}

// RegisterResources adds the thread resource template to s.
func RegisterResources(s *mcp.Server, d *Deps) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "thread",
		Title:       "T3 Code thread",
		Description: "A thread as t3_thread shows it (JSON). Subscribe to be told when it moves; complete machine, project and thread.",
		MIMEType:    "application/json",
		URITemplate: ThreadURITemplate,
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		f, err := d.findURI(req.Params.URI)
		if err != nil {
			return nil, err
		}
		st, err := d.state(ctx, f, f.Shell, 3, nil)
		if err != nil {
			return nil, err
		}
		raw, err := st.MarshalJSON()
		if err != nil {
			return nil, err
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "application/json", Text: string(raw)}}}, nil
	})
}

// maxCompletions is the most values one completion returns (MCP's limit).
const maxCompletions = 100

// complete answers completion/complete for the template's arguments:
// machine names, the machine's allowlisted project ids, the project's
// threads (newest first); each by prefix of what was typed.
func (d *Deps) complete(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	p := req.Params
	res := &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}}}
	if p.Ref == nil || p.Ref.Type != "ref/resource" || p.Ref.URI != ThreadURITemplate {
		return res, nil
	}
	ctxArgs := map[string]string{}
	if p.Context != nil {
		ctxArgs = p.Context.Arguments
	}
	typed := p.Argument.Value
	var values []string
	switch p.Argument.Name {
	case "machine":
		for _, m := range d.Fleet.Machines() {
			values = append(values, m.Name)
		}
	case "project":
		if m, err := d.Fleet.Machine(ctxArgs["machine"]); err == nil {
			for _, pr := range m.Projects() {
				values = append(values, pr.ID)
			}
		}
	case "thread":
		if m, err := d.Fleet.Machine(ctxArgs["machine"]); err == nil {
			threads := m.Threads()
			sort.SliceStable(threads, func(i, j int) bool { return threads[i].UpdatedAt.Or("") > threads[j].UpdatedAt.Or("") })
			for _, t := range threads {
				if pr := ctxArgs["project"]; pr == "" || t.ProjectId == pr {
					values = append(values, t.ID)
				}
			}
		}
	}
	for _, v := range values {
		if strings.HasPrefix(v, typed) {
			res.Completion.Values = append(res.Completion.Values, v)
		}
	}
	res.Completion.Total = len(res.Completion.Values)
	if len(res.Completion.Values) > maxCompletions {
		res.Completion.Values = res.Completion.Values[:maxCompletions]
		res.Completion.HasMore = true
	}
	return res, nil
}
