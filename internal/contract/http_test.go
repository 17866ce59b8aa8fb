package contract

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

// unmodelledRoutes are routes t3code-mcp never calls, so openapi.yaml leaves them out; their
// recorded bodies are skipped by name. A route in a recording that is neither here nor in
// httpTarget fails the test, so a new recording forces a decision.
var unmodelledRoutes = map[string]string{
	"/api/auth/pairing-token":     "pairing credentials: set up by a person, not the connector",
	"/oauth/token":                "token exchange: set up by a person, not the connector",
	"/api/orchestration/snapshot": "protocol-1 route, absent on protocol 2",
}

// httpTarget returns the generated type a successful response of path decodes into.
func httpTarget(path string) (string, decoder) {
	switch {
	case path == "/.well-known/t3/environment":
		return "EnvironmentDescriptor", new(t3api.EnvironmentDescriptor)
	case path == "/api/auth/session":
		return "AuthSessionState", new(t3api.AuthSessionState)
	case path == "/api/auth/websocket-ticket":
		return "WebSocketTicket", new(t3api.WebSocketTicket)
	case path == "/api/orchestration/shell":
		return "ShellSnapshot", new(t3api.ShellSnapshot)
	case path == "/api/projects":
		return "ProjectList", new(t3api.ProjectList)
	case path == "/api/projects/mutate":
		return "Project", new(t3api.Project) // project.create answers with the project
	case strings.HasPrefix(path, "/api/orchestration/threads/"):
		rest := strings.TrimPrefix(path, "/api/orchestration/threads/")
		switch {
		case strings.HasSuffix(rest, "/bounded"):
			return "BoundedThreadSnapshot", new(t3api.BoundedThreadSnapshot)
		case strings.HasSuffix(rest, "/history"):
			return "ThreadHistoryPage", new(t3api.ThreadHistoryPage)
		case !strings.Contains(rest, "/"):
			return "ThreadSnapshot", new(t3api.ThreadSnapshot)
		}
	}
	return "", nil
}

// TestRecordedHTTPBodiesDecode decodes every recorded HTTP response body with the t3api type its
// route returns (ErrorBody for JSON error responses), and counts what it skips and why.
func TestRecordedHTTPBodiesDecode(t *testing.T) {
	recs := loadRecordings(t)
	c := counter{}
	projections := recordedProjections(t, recs)
	for _, rec := range recs {
		for _, ex := range rec.Exchanges {
			where := rec.file + ": " + ex.String()
			body, err := ex.body()
			if err != nil {
				t.Errorf("%s: read body: %v", where, err)
				continue
			}
			u, err := url.Parse(ex.URL)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			path := u.Path
			contentType := ex.ResponseHeaders["content-type"]
			switch {
			case ex.Status == 101:
				c.add("skipped: 101 WebSocket upgrade (no body)")
				continue
			case len(body) == 0:
				c.add("skipped: empty body")
				continue
			case ex.Status == 503 && strings.HasPrefix(contentType, "text/plain"):
				// The recording server had no web UI, so unknown routes fell through to its static
				// file handler ("No static directory configured ...").
				c.add("skipped: 503 text/plain from the recording server's static fallback")
				continue
			}
			if ex.Status >= 400 {
				if !json.Valid(body) {
					t.Errorf("%s: error body is not JSON: %.120q", where, body)
					continue
				}
				var e t3api.ErrorBody
				if err := decode(&e, body); err != nil {
					t.Errorf("%s: ErrorBody: %v", where, err)
					continue
				}
				c.add("ErrorBody")
				continue
			}
			if reason, ok := unmodelledRoutes[path]; ok {
				c.add("skipped: unmodelled route " + path + " (" + reason + ")")
				continue
			}
			name, target := httpTarget(path)
			if target == nil {
				t.Errorf("%s: no generated type for route %s: add it to openapi.yaml and httpTarget, or to unmodelledRoutes", where, path)
				continue
			}
			if name == "BoundedThreadSnapshot" {
				body = withRecordedProjection(t, where, body, path, projections)
				if body == nil {
					continue
				}
			}
			if err := decode(target, body); err != nil {
				t.Errorf("%s: %s: %v", where, name, err)
				continue
			}
			c.add(name)
		}
	}
	c.log(t)
	c.requirePositive(t, "EnvironmentDescriptor", "AuthSessionState", "WebSocketTicket", "ShellSnapshot",
		"ThreadSnapshot", "BoundedThreadSnapshot", "ThreadHistoryPage", "ProjectList", "Project", "ErrorBody")
}

// recordedProjections maps a thread id to the projection of its recorded GET /threads/{id}.
func recordedProjections(t *testing.T, recs []recording) map[string]json.RawMessage {
	t.Helper()
	out := map[string]json.RawMessage{}
	for _, rec := range recs {
		for _, ex := range rec.Exchanges {
			u, err := url.Parse(ex.URL)
			if err != nil || ex.Status != 200 {
				continue
			}
			id, ok := strings.CutPrefix(u.Path, "/api/orchestration/threads/")
			if !ok || strings.Contains(id, "/") {
				continue
			}
			body, err := ex.body()
			if err != nil {
				continue
			}
			var snap struct {
				Projection json.RawMessage `json:"projection"`
			}
			if json.Unmarshal(body, &snap) == nil && len(snap.Projection) > 0 {
				out[id] = snap.Projection
			}
		}
	}
	return out
}

// withRecordedProjection fills in a synthetic /bounded body whose projection is a placeholder
// ("<same shape as …>") with the recorded projection of the same thread.
func withRecordedProjection(t *testing.T, where string, body []byte, path string, projections map[string]json.RawMessage) []byte {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		t.Errorf("%s: %v", where, err)
		return nil
	}
	var placeholder string
	if json.Unmarshal(fields["projection"], &placeholder) != nil {
		return body // a real projection
	}
	id := strings.TrimSuffix(strings.TrimPrefix(path, "/api/orchestration/threads/"), "/bounded")
	p, ok := projections[id]
	if !ok {
		t.Errorf("%s: placeholder projection %q and no recorded projection of thread %s", where, placeholder, id)
		return nil
	}
	fields["projection"] = p
	out, err := json.Marshal(fields)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return nil
	}
	return out
}
