package t3fake

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// HTTP routes. Bodies are built with gen/t3api; records shared with the WebSocket side are built
// once as gen/t3rpc values and carried over by encoding and decoding (the two packages generate
// the same model.json, so the round trip also checks that the HTTP schema accepts them).

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern string, h http.HandlerFunc) {
		answer := gzipAnswers(h) // gzip.go; it sets Vary: Accept-Encoding, as on every recorded answer
		if pattern == "GET /ws" {
			answer = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Vary", "Accept-Encoding")
				h(w, r)
			}
		}
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.countHTTP(pattern)
			answer(w, r)
		})
	}
	handle("GET /.well-known/t3/environment", s.handleDescriptor)
	handle("GET /api/auth/session", s.handleSession)
	handle("POST /api/auth/websocket-ticket", s.handleTicket)
	handle("GET /api/orchestration/shell", s.read(true, "orchestration_snapshot_failed", s.handleShell))
	handle("GET /api/orchestration/threads/{id}", s.read(true, "orchestration_thread_snapshot_failed", s.handleThread))
	handle("GET /api/orchestration/threads/{id}/bounded", s.read(true, "orchestration_thread_snapshot_failed", s.handleBounded))
	handle("GET /api/orchestration/threads/{id}/history", s.read(true, "orchestration_thread_snapshot_failed", s.handleHistory))
	handle("GET /api/projects", s.read(false, "project_snapshot_failed", s.handleProjects))
	handle("POST /api/projects/mutate", s.handleProjectMutate)
	handle("GET /ws", s.handleWS)
	// Any other path: what a headless `t3 serve` answers (recorded for routes it does not have).
	handle("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "No static directory configured and no dev URL set.")
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v encoder) {
	writeEncoded(w, status, v.Encode)
}

// writeEncoded writes what f encodes from a pooled encoder's buffer (no copy of the body). Its
// pool keeps large buffers too (up to maxPooledBody): a thread projection of 5,000 turn items
// (1.3 MB /bounded, 4.5 MB whole) grew a fresh buffer to the body's size on every read, 7.8 MB
// allocated, zeroed and faulted in per /bounded read, which was most of the fake's CPU in the
// t3_thread phase (docs/benchmarks.md, "The fake's thread reads"). A streaming encoder (a small
// buffer written out as it fills) allocated nothing but cost more: jx writes a stream byte by
// byte (BenchmarkBoundedGET, 12.0 against 6-7 ms per read at 5,000 items).
func writeEncoded(w http.ResponseWriter, status int, f func(e *jx.Encoder)) {
	e := bodyEncoders.Get().(*jx.Encoder)
	e.Reset()
	f(e)
	writeBody(w, status, e)
}

// writeBody writes e's bytes and gives e back to bodyEncoders (e came from there, Reset).
func writeBody(w http.ResponseWriter, status int, e *jx.Encoder) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(e.Bytes())
	if cap(e.Bytes()) <= maxPooledBody {
		bodyEncoders.Put(e)
	}
}

// bodyEncoders keeps writeEncoded's encoders with their buffers, however large they grew (up to
// maxPooledBody): a few at a time are in use, one per concurrent read.
var bodyEncoders = sync.Pool{New: func() any { return &jx.Encoder{} }}

// maxPooledBody is the largest buffer bodyEncoders keeps: a /bounded body of 50,000 turn items
// is 17 MB, a whole thread of 50,000 items 45 MB.
const maxPooledBody = 64 << 20

// traceID imitates T3's per-response trace ids; nothing depends on their value.
func traceID() string {
	return fmt.Sprintf("%016x%016x", mrand.Uint64(), mrand.Uint64())
}

func writeError(w http.ResponseWriter, status int, tag, code, reason string) {
	body := t3api.ErrorBody{Tag: t3api.NewOptString(tag), Code: t3api.NewOptString(code), TraceId: t3api.NewOptString(traceID())}
	if reason != "" {
		body.Reason = t3api.NewOptString(reason)
	}
	writeJSON(w, status, &body)
}

func authError(w http.ResponseWriter, reason string) {
	writeError(w, http.StatusUnauthorized, "EnvironmentAuthInvalidError", "auth_invalid", reason)
}

// credential checks the bearer token: scopes, or the 401 reason.
func (s *Server) credential(r *http.Request) (scopes []string, reason string) {
	if s.unauthorized.Load() {
		return nil, "invalid_credential"
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, "missing_credential"
	}
	scheme, tok, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return nil, "invalid_credential"
	}
	scopes, found := s.tokens[strings.TrimSpace(tok)]
	if !found {
		return nil, "invalid_credential"
	}
	return scopes, ""
}

// read wraps a read route with, in order: the HTTPHang and HTTPFail switches, bearer auth,
// the protocol-2 header (orchestration routes only) and the read scope.
func (s *Server) read(orchestration bool, failReason string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.hangMu.Lock()
		hang := s.hang
		s.hangMu.Unlock()
		if hang != nil {
			select {
			case <-hang:
			case <-r.Context().Done():
				return
			case <-s.stop:
			}
		}
		if st := s.httpFail.Load(); st != 0 {
			writeError(w, int(st), "EnvironmentInternalError", "internal_error", failReason)
			return
		}
		if s.threadFaults.apply(w, r, s.stop, failReason) {
			return
		}
		scopes, reason := s.credential(r)
		if reason != "" {
			authError(w, reason)
			return
		}
		if orchestration && s.protocol.Load() == 2 && r.Header.Get("x-t3-orchestration-protocol") != "2" {
			// T3 declares the header as a schema literal, so its absence fails request decoding.
			writeError(w, http.StatusBadRequest, "EnvironmentRequestInvalidError", "invalid_request", "invalid_request")
			return
		}
		if !hasScope(scopes, ScopeRead) {
			scopeError(w, ScopeRead)
			return
		}
		h(w, r)
	}
}

func scopeError(w http.ResponseWriter, scope string) {
	body := t3api.ErrorBody{
		Tag: t3api.NewOptString("EnvironmentScopeRequiredError"), Code: t3api.NewOptString("insufficient_scope"),
		RequiredScope: t3api.NewOptString(scope), TraceId: t3api.NewOptString(traceID()),
	}
	writeJSON(w, http.StatusForbidden, &body)
}

// toAPI carries a t3rpc value over to the t3api type of the same model.json definition.
func toAPI(src encoder, dst decoder) error {
	if err := dst.Decode(jx.DecodeBytes(encode(src))); err != nil {
		return fmt.Errorf("t3fake: t3rpc→t3api: %w", err)
	}
	return nil
}

func internalError(w http.ResponseWriter, reason string) {
	writeError(w, http.StatusInternalServerError, "EnvironmentInternalError", "internal_error", reason)
}

func (s *Server) handleDescriptor(w http.ResponseWriter, _ *http.Request) {
	d := s.descriptor()
	var out t3api.EnvironmentDescriptor
	if err := toAPI(&d, &out); err != nil {
		internalError(w, "environment_descriptor_failed")
		return
	}
	writeJSON(w, http.StatusOK, &out)
}

// sessionExpiry is when the fake's tokens expire: T3's default 30-day session lifetime, counted
// from the clock's now so that the value looks current.
func (s *Server) sessionExpiry() string { return iso(s.now().Add(30 * 24 * time.Hour)) }

func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) {
	scopes, reason := s.credential(r)
	if reason != "" {
		writeJSON(w, http.StatusOK, &t3api.AuthSessionState{Authenticated: false}) // never 401
		return
	}
	writeJSON(w, http.StatusOK, &t3api.AuthSessionState{
		Authenticated: true,
		Scopes:        append([]string{}, scopes...),
		SessionMethod: t3api.NewOptString("bearer-access-token"),
		ExpiresAt:     t3api.NewOptString(s.sessionExpiry()),
	})
}

func (s *Server) handleTicket(w http.ResponseWriter, r *http.Request) {
	scopes, reason := s.credential(r)
	if reason != "" {
		authError(w, reason)
		return
	}
	if s.refuseTickets.Load() {
		internalError(w, "websocket_ticket_issuance_failed")
		return
	}
	tk := rand.Text()
	exp := time.Now().Add(s.ticketTTL)
	s.mu.Lock()
	now := time.Now()
	for k, t := range s.tickets { // expired tickets would otherwise pile up under load
		if now.After(t.expires) {
			delete(s.tickets, k)
		}
	}
	s.tickets[tk] = ticket{scopes: scopes, expires: exp}
	s.mu.Unlock()
	s.ticketsIssued.Add(1)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	writeJSON(w, http.StatusOK, &t3api.WebSocketTicket{Ticket: tk, ExpiresAt: t3api.NewOptString(iso(s.now().Add(s.ticketTTL)))})
}

func (s *Server) handleShell(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	snap := s.shellSnapshot()
	s.mu.Unlock()
	var out t3api.ShellSnapshot
	if err := toAPI(&snap, &out); err != nil {
		internalError(w, "orchestration_snapshot_failed")
		return
	}
	writeJSON(w, http.StatusOK, &out)
}

func threadNotFound(w http.ResponseWriter) {
	writeError(w, http.StatusNotFound, "EnvironmentResourceNotFoundError", "not_found", "thread_not_found")
}

// lockThread finds a thread for a read and returns it locked (nil: none), without Server.mu.
func (s *Server) lockThread(id string) *thread {
	s.idMu.RLock()
	th := s.threadByID[id]
	s.idMu.RUnlock()
	if th != nil {
		th.mu.Lock()
	}
	return th
}

func (s *Server) handleThread(w http.ResponseWriter, r *http.Request) {
	th := s.lockThread(r.PathValue("id"))
	if th == nil {
		threadNotFound(w)
		return
	}
	// The head read after the thread is locked: every event of the thread is at or below it.
	// t3api.ThreadSnapshot's fields, in its order, with the t3rpc projection encoded in place:
	// both packages are generated from the same model.json, so the bytes are the ones a
	// t3rpc→t3api round trip would give (TestThreadBodyMatchesAPIRoundTrip), without it. The
	// projection is encoded under the thread's lock straight from its records (encodeProjection),
	// not from a copy; the lock is let go before the body is written.
	e := bodyEncoders.Get().(*jx.Encoder)
	e.Reset()
	e.ObjStart()
	e.FieldStart("snapshotSequence")
	e.Int64(s.headPub.Load())
	e.FieldStart("projection")
	encodeProjection(e, th, s.opts.ControlPlane)
	e.ObjEnd()
	th.mu.Unlock()
	writeBody(w, http.StatusOK, e)
}

// History cursors are opaque to clients; inside they name the ordinal of the oldest item already
// returned, so the next page is everything older.
func historyCursor(ordinal int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("t3fake-history:" + strconv.FormatInt(ordinal, 10)))
}

func parseHistoryCursor(c string) (int64, bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, false
	}
	rest, found := strings.CutPrefix(string(b), "t3fake-history:")
	if !found {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil
}

// routeMissing answers as an older build without the route (BoundedRoute).
func (s *Server) routeMissing(w http.ResponseWriter) bool {
	switch st := int(s.boundedRoute.Load()); st {
	case 0:
		return false
	case http.StatusNotFound:
		http.Error(w, "404 page not found", st)
	default:
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(st)
		_, _ = io.WriteString(w, "No static directory configured and no dev URL set.")
	}
	return true
}

func (s *Server) handleBounded(w http.ResponseWriter, r *http.Request) {
	if s.routeMissing(w) {
		return
	}
	th := s.lockThread(r.PathValue("id"))
	if th == nil {
		threadNotFound(w)
		return
	}
	// t3api.BoundedThreadSnapshot's fields in its order, the projection built as T3 builds it
	// (encodeBounded), encoded under the thread's lock straight from its records (see
	// handleThread).
	e := bodyEncoders.Get().(*jx.Encoder)
	e.Reset()
	e.ObjStart()
	s.encodeBoundedFields(e, th, s.headPub.Load())
	e.ObjEnd()
	th.mu.Unlock()
	writeBody(w, http.StatusOK, e)
}

func (s *Server) handleHistory(w http.ResponseWriter, r *http.Request) {
	if s.routeMissing(w) {
		return
	}
	before, valid := parseHistoryCursor(r.URL.Query().Get("cursor"))
	if !valid {
		writeError(w, http.StatusBadRequest, "EnvironmentRequestInvalidError", "invalid_request", "invalid_history_cursor")
		return
	}
	th := s.lockThread(r.PathValue("id"))
	if th == nil {
		threadNotFound(w)
		return
	}
	seq := s.headPub.Load()
	end := 0
	for end < len(th.items) && th.items[end].Ordinal < before {
		end++ // items are in ordinal order: runs are sequential and number their items upwards
	}
	start := max(0, end-s.historyPage)
	page := itemValues(th.items[start:end])
	th.mu.Unlock()
	out := t3api.ThreadHistoryPage{
		SnapshotSequence: seq,
		Items:            make([]t3api.TurnItem, len(page)),
		NextCursor:       t3api.OptNilString{Set: true, Null: true},
		HasMoreHistory:   t3api.NewOptBool(start > 0),
	}
	if start > 0 {
		out.NextCursor = t3api.NewOptNilString(historyCursor(page[0].Ordinal))
	}
	for i := range page {
		if err := toAPI(&page[i], &out.Items[i]); err != nil {
			internalError(w, "orchestration_thread_snapshot_failed")
			return
		}
	}
	writeJSON(w, http.StatusOK, &out)
}

func (s *Server) handleProjects(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	out := t3api.ProjectList{Projects: make([]t3api.Project, len(s.projects)), UpdatedAt: t3api.NewOptString(s.ts())}
	recs := make([]t3rpc.Project, len(s.projects))
	for i, p := range s.projects {
		recs[i] = p.rec
	}
	s.mu.Unlock()
	for i := range recs {
		rec := recs[i]
		rec.DeletedAt = null() // /api/projects lists deletedAt; the shell's project rows do not
		if err := toAPI(&rec, &out.Projects[i]); err != nil {
			internalError(w, "project_snapshot_failed")
			return
		}
	}
	writeJSON(w, http.StatusOK, &out)
}

// handleProjectMutate is POST /api/projects/mutate with project.create, the one mutation a
// connector might need to set up a machine (and the route where T3 was recorded answering 403
// insufficient_scope to a read-only token). Other mutation types and bodies that do not decode get
// T3's recorded answer to a bad body: 400 with an empty body.
func (s *Server) handleProjectMutate(w http.ResponseWriter, r *http.Request) {
	scopes, reason := s.credential(r)
	if reason != "" {
		authError(w, reason)
		return
	}
	if !hasScope(scopes, ScopeOperate) {
		scopeError(w, ScopeOperate)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f, isObj := peekStrings(body, "type", "projectId", "title", "workspaceRoot")
	if !isObj || f["type"] != "project.create" || f["projectId"] == "" || f["title"] == "" || f["workspaceRoot"] == "" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	p := s.projectByID[f["projectId"]]
	if p == nil {
		p = s.addProject(f["projectId"], f["title"], f["workspaceRoot"])
	}
	rec := p.rec
	s.mu.Unlock()
	rec.DeletedAt = null()
	var out t3api.Project
	if err := toAPI(&rec, &out); err != nil {
		internalError(w, "project_mutation_failed")
		return
	}
	writeJSON(w, http.StatusOK, &out)
}

// handleWS is the /ws upgrade: protocol gate first (so a refused client does not spend its ticket),
// then the ticket or bearer credential, then Effect RPC on the socket.
func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if s.protocol.Load() == 2 && q.Get("orchestrationProtocol") != "2" {
		// No generated type has orchestrationProtocolVersion next to code/message: written by hand,
		// field for field as the gate fixture.
		var e jx.Encoder
		e.ObjStart()
		e.FieldStart("code")
		e.Str("orchestration_protocol_incompatible")
		e.FieldStart("message")
		e.Str("Update this client to one that supports orchestration protocol 2.")
		e.FieldStart("orchestrationProtocolVersion")
		e.Int(2)
		e.ObjEnd()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUpgradeRequired)
		_, _ = w.Write(e.Bytes())
		return
	}
	var scopes []string
	if tk := q.Get("wsTicket"); tk != "" {
		if s.unauthorized.Load() {
			authError(w, "invalid_credential")
			return
		}
		s.mu.Lock()
		t, found := s.tickets[tk]
		delete(s.tickets, tk) // single-use, even when expired
		s.mu.Unlock()
		if !found || time.Now().After(t.expires) {
			authError(w, "invalid_credential")
			return
		}
		scopes = t.scopes
	} else {
		var reason string
		if scopes, reason = s.credential(r); reason != "" {
			authError(w, reason)
			return
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		InsecureSkipVerify: true, // no browser involved; T3 itself accepts its web app's origins
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return
	}
	s.serveConn(ws, scopes)
}
