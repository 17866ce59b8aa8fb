package t3fake

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The shape test: the fake and the recordings in testdata/t3 are run through the same classifier,
// which collects, per kind of object (a ThreadShell, a Run, a TurnItem of each type, an error body,
// an Exit cause, …), the set of JSON keys seen and the values of enum-like fields. For every kind
// the fake sends, its keys must be the recorded keys minus exactly the documented omissions below,
// and its enum values must have been seen in the recordings (or be documented in
// t3-protocol.md). So a field the fake adds, drops or misspells, or a status T3 never sent, fails
// here, and so does an omission list that no longer matches.

const fixtureDir = "../../testdata/t3"

// omittedKeys are the recorded keys the fake does not send: fields of T3's records that the
// generated types (what the connector decodes) do not declare. Each line says what they are.
var omittedKeys = map[string][]string{
	// Internals of T3's execution graph and provider plumbing.
	"AppThread":      {"activeProviderThreadId", "forkedFrom", "lastVisitedAt", "lineage", "providerInstanceId", "settledAt", "settledOverride", "snoozedAt", "snoozedUntil", "titleRegeneration"},
	"ThreadShell":    {"activeProviderThreadId", "createdBy", "creationSource", "forkedFrom", "hasActionableProposedPlan", "lastVisitedAt", "latestUserMessageAt", "lineage", "providerInstanceId", "settledAt", "settledOverride", "snoozedAt", "snoozedUntil", "titleRegeneration", "visibleItemCount"},
	"Run":            {"activeAttemptId", "contextHandoffId", "providerInstanceId", "providerThreadId", "queuePosition", "rootNodeId"},
	"RuntimeRequest": {"nativeRequestRef", "providerTurnId"},
	"Message":        {"attachments", "createdBy", "creationSource", "nodeId"},
	"Checkpoint":     {"appRunOrdinal", "nodeId", "ordinalWithinScope", "parentCheckpointId", "ref", "scopeId", "threadId"},
	"DomainEvent":    {"driver", "nodeId", "providerInstanceId"},
	// Every turn item: node and provider references.
	"TurnItem.assistant_message":     {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.checkpoint":            {"checkpointId", "nativeItemRef", "nodeId", "providerThreadId", "providerTurnId", "scopeId"},
	"TurnItem.command_execution":     {"nativeItemRef", "nodeId", "output", "providerThreadId", "providerTurnId"}, // output: T3 strips it on the wire too
	"TurnItem.error":                 {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.run_interrupt_request": {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.run_interrupt_result":  {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.user_input_request":    {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.approval_request":      {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.user_message":          {"attachments", "createdBy", "creationSource", "inputIntent", "nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	"TurnItem.file_change":           {"nativeItemRef", "nodeId", "providerThreadId", "providerTurnId"},
	// The projection's arrays the connector does not read.
	"ThreadProjection":   {"attempts", "checkpointScopes", "contextHandoffs", "contextTransfers", "nodes", "plans", "providerSessions", "providerThreads", "providerTurns", "subagents"},
	"Project":            {"faviconPath", "repositoryIdentity", "scripts"},
	"Project(shell)":     {"repositoryIdentity", "scripts"},
	"ShellItem.snapshot": {"resolvedRepositoryIdentityRoots"},
	// The auth policy block of the session (browser pairing details).
	"Session.true":  {"auth"},
	"Session.false": {"auth"},
	// The typed errors' cause chain (server-side stack of causes).
	"Err.OrchestrationV2DispatchCommandError":     {"cause"},
	"Err.OrchestrationV2GetThreadProjectionError": {"cause"},
	// server.getConfig: only environment, cwd and providers are read.
	"ServerConfig":     {"auth", "availableEditors", "issues", "keybindings", "keybindingsConfigPath", "observability", "settings", "shellResumeCompletionMarker", "threadResumeCompletionMarker"},
	"Provider":         {"auth", "checkedAt", "continuation", "requiresNewThreadForModelChange", "showInteractionModeToggle", "skills", "slashCommands", "version", "versionAdvisory"},
	"Model":            {"isCustom", "isLegacy"},
	"OptionDescriptor": {"currentValue", "promptInjectedValues"},
}

// documentedKeys are key sets of kinds the recordings do not hold (the mock agent changed no files,
// never failed a launch, …), taken from ../shared/t3-protocol.md; "+base" adds the keys every
// recorded turn item has.
var documentedKeys = map[string][]string{
	"TurnItem.file_change":                 {"+base", "fileName", "additions", "deletions"}, // §7.2
	"ChangedFile":                          {"path", "kind", "additions", "deletions"},      // §7.2 checkpoints[].files
	"Err.OrchestrationV2ThreadLaunchError": {"_tag", "commandId", "projectId", "message"},   // §6.2.1
	"HTTPError.EnvironmentInternalError":   {"_tag", "code", "reason", "traceId"},           // §3.4
	"S.Pong":                               {"_tag"},                                        // §4.3
	"Question":                             {"multiSelect"},                                 // §6.2.3, on top of the recorded keys
	"BoundedSnapshot":                      {"payloadBudgetExceeded"},                       // §5.3 (T3's buildBoundedThreadProjection sets it)
}

// documentedValues are enum values the recordings do not show, with where they are documented.
var documentedValues = map[string][]string{
	"ti.status.file_change":       {"completed"},   // §7.2 (a finished edit)
	"ti.status.command_execution": {"interrupted"}, // a command cut short by run.interrupt, like run_interrupt_result's status
	"file.kind":                   {"modified"},    // T3's OrchestrationCheckpointFile.kind is free text
	"creationSource":              {"mcp", "server"},
	"httperr":                     {"500 EnvironmentInternalError internal_error websocket_ticket_issuance_failed", "500 EnvironmentInternalError internal_error orchestration_snapshot_failed"}, // §3.4
	"err.tag":                     {"OrchestrationV2ThreadLaunchError"},                                                                                                                          // §6.2.1
}

// mustCover are the kinds the fake has to produce in the session below (the brief's list).
var mustCover = []string{
	"ThreadShell", "Run", "RuntimeRequest", "Message", "Checkpoint", "ChangedFile", "ShellSnapshot", "ThreadProjection", "AppThread",
	"TurnItem.user_message", "TurnItem.assistant_message", "TurnItem.command_execution", "TurnItem.file_change",
	"TurnItem.checkpoint", "TurnItem.user_input_request", "TurnItem.error", "TurnItem.run_interrupt_request",
	"TurnItem.run_interrupt_result", "Question", "QuestionOption", "Failure", "PendingRuntimeRequest", "VisibleMessage",
	"Descriptor.v1", "Descriptor.v2", "Session.true", "Session.false", "Ticket", "ProjectList", "Project", "Project(shell)",
	"ThreadSnapshot", "BoundedSnapshot", "HistoryPage", "Upgrade426",
	"HTTPError.EnvironmentAuthInvalidError", "HTTPError.EnvironmentScopeRequiredError",
	"HTTPError.EnvironmentResourceNotFoundError", "HTTPError.EnvironmentRequestInvalidError", "HTTPError.EnvironmentInternalError",
	"Exit.Success", "Exit.Failure", "Cause.Fail", "Cause.Die", "Cause.Interrupt",
	"Err.EnvironmentAuthorizationError", "Err.OrchestrationV2DispatchCommandError", "Err.OrchestrationV2GetThreadProjectionError",
	"Err.OrchestrationV2ThreadLaunchError", "DispatchResult", "LaunchResult", "ServerConfig", "Provider", "Model",
	"ShellItem.snapshot", "ShellItem.synchronized", "ShellItem.thread.updated", "ShellItem.project.updated",
	"ThreadItem.snapshot", "ThreadItem.synchronized", "ThreadItem.event", "DomainEvent", "S.Chunk", "S.Exit",
}

// ---- classifier ----

type doc struct {
	Exchanges []struct {
		Name         string          `json:"name"`
		URL          string          `json:"url"`
		Status       int             `json:"status"`
		ResponseBody json.RawMessage `json:"responseBody"`
	} `json:"exchanges"`
	Frames []frame `json:"frames"`
}

type shapes struct {
	keys map[string]map[string]bool
	vals map[string]map[string]bool
}

func newShapes() *shapes {
	return &shapes{keys: map[string]map[string]bool{}, vals: map[string]map[string]bool{}}
}

func (sh *shapes) add(kind string, v any) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	if sh.keys[kind] == nil {
		sh.keys[kind] = map[string]bool{}
	}
	for k := range m {
		sh.keys[kind][k] = true
	}
	return m
}

func (sh *shapes) val(kind string, v any) {
	s, ok := v.(string)
	if !ok {
		return
	}
	if sh.vals[kind] == nil {
		sh.vals[kind] = map[string]bool{}
	}
	sh.vals[kind][s] = true
}

func list(v any) []any { l, _ := v.([]any); return l }

func (sh *shapes) run(v any) {
	m := sh.add("Run", v)
	sh.val("run.status", m["status"])
}

func (sh *shapes) request(v any) {
	m := sh.add("RuntimeRequest", v)
	sh.val("rr.kind", m["kind"])
	sh.val("rr.status", m["status"])
}

func (sh *shapes) item(v any) {
	m, _ := v.(map[string]any)
	typ, _ := m["type"].(string)
	sh.add("TurnItem."+typ, m)
	sh.val("ti.status."+typ, m["status"])
	for _, q := range list(m["questions"]) {
		sh.add("Question", q)
		for _, o := range list(q.(map[string]any)["options"]) {
			sh.add("QuestionOption", o)
		}
	}
	if f := sh.add("Failure", m["failure"]); f != nil {
		sh.val("failure.class", f["class"])
	}
	for _, f := range list(m["files"]) {
		sh.file(f)
	}
}

func (sh *shapes) file(v any) {
	m := sh.add("ChangedFile", v)
	sh.val("file.kind", m["kind"])
}

func (sh *shapes) checkpoint(v any) {
	m := sh.add("Checkpoint", v)
	sh.val("ck.status", m["status"])
	for _, f := range list(m["files"]) {
		sh.file(f)
	}
}

func (sh *shapes) appThread(v any) {
	m := sh.add("AppThread", v)
	sh.val("creationSource", m["creationSource"])
	sh.val("createdBy", m["createdBy"])
	sh.val("runtimeMode", m["runtimeMode"])
	sh.val("interactionMode", m["interactionMode"])
}

func (sh *shapes) projection(v any) {
	m := sh.add("ThreadProjection", v)
	if m == nil {
		return // the synthetic fixture writes a placeholder string
	}
	sh.appThread(m["thread"])
	for _, x := range list(m["runs"]) {
		sh.run(x)
	}
	for _, x := range list(m["runtimeRequests"]) {
		sh.request(x)
	}
	for _, x := range list(m["messages"]) {
		sh.message(x)
	}
	for _, x := range list(m["turnItems"]) {
		sh.item(x)
	}
	for _, x := range list(m["checkpoints"]) {
		sh.checkpoint(x)
	}
	for _, x := range list(m["visibleTurnItems"]) {
		if w := sh.add("VisibleTurnItem", x); w != nil {
			sh.val("visibility", w["visibility"])
			sh.item(w["item"])
		}
	}
}

func (sh *shapes) message(v any) {
	m := sh.add("Message", v)
	sh.val("message.role", m["role"])
}

func (sh *shapes) shellRow(v any) {
	m := sh.add("ThreadShell", v)
	sh.val("shell.status", m["status"])
	sh.add("PendingRuntimeRequest", m["pendingRuntimeRequest"])
	sh.add("VisibleMessage", m["latestVisibleMessage"])
	if p, ok := m["pendingRuntimeRequest"].(map[string]any); ok {
		sh.val("rr.kind", p["kind"])
	}
}

func (sh *shapes) shellSnapshot(v any) {
	m := sh.add("ShellSnapshot", v)
	for _, t := range append(list(m["threads"]), list(m["archivedThreads"])...) {
		sh.shellRow(t)
	}
	for _, p := range list(m["projects"]) {
		sh.add("Project(shell)", p)
	}
}

func (sh *shapes) shellItem(v any) {
	m, _ := v.(map[string]any)
	kind, _ := m["kind"].(string)
	sh.add("ShellItem."+kind, m)
	switch kind {
	case "snapshot":
		sh.shellSnapshot(m["snapshot"])
	case "thread.updated":
		sh.shellRow(m["thread"])
		sh.val("location", m["location"])
	case "thread.removed":
		sh.val("location", m["location"])
	case "project.updated":
		sh.add("Project(shell)", m["project"])
	}
}

func (sh *shapes) threadItem(v any) {
	m, _ := v.(map[string]any)
	kind, _ := m["kind"].(string)
	sh.add("ThreadItem."+kind, m)
	switch kind {
	case "snapshot":
		sh.projection(m["projection"])
	case "event":
		e := sh.add("DomainEvent", m["event"])
		typ, _ := e["type"].(string)
		sh.val("event.type", typ)
		switch {
		case strings.HasPrefix(typ, "run."):
			sh.run(e["payload"])
		case typ == "turn-item.updated":
			sh.item(e["payload"])
		case typ == "runtime-request.updated":
			sh.request(e["payload"])
		case typ == "message.updated":
			sh.message(e["payload"])
		case typ == "checkpoint.captured":
			sh.checkpoint(e["payload"])
		case typ == "thread.created":
			sh.appThread(e["payload"])
		}
	}
}

func (sh *shapes) httpBody(rawURL string, status int, body any) {
	m, ok := body.(map[string]any)
	if !ok {
		return
	}
	u, _ := url.Parse(rawURL)
	p := u.Path
	if tag, _ := m["_tag"].(string); tag != "" {
		sh.add("HTTPError."+tag, m)
		reason, _ := m["reason"].(string)
		sh.val("httperr", fmt.Sprintf("%d %s %s %s", status, tag, m["code"], reason))
		return
	}
	switch {
	case status == 426:
		sh.add("Upgrade426", m)
	case strings.HasSuffix(p, "/.well-known/t3/environment"):
		if _, v2 := m["orchestrationProtocolVersion"]; v2 {
			sh.add("Descriptor.v2", m)
		} else {
			sh.add("Descriptor.v1", m)
		}
	case strings.HasSuffix(p, "/api/auth/session"):
		sh.add(fmt.Sprintf("Session.%v", m["authenticated"]), m)
	case strings.HasSuffix(p, "/websocket-ticket"):
		sh.add("Ticket", m)
	case strings.HasSuffix(p, "/api/orchestration/shell"):
		sh.shellSnapshot(m)
	case strings.HasSuffix(p, "/bounded"):
		sh.add("BoundedSnapshot", m)
		sh.projection(m["projection"])
	case strings.HasSuffix(p, "/history"):
		sh.add("HistoryPage", m)
		for _, it := range list(m["items"]) {
			sh.item(it)
		}
	case strings.Contains(p, "/api/orchestration/threads/"):
		sh.add("ThreadSnapshot", m)
		sh.projection(m["projection"])
	case strings.HasSuffix(p, "/api/projects"):
		sh.add("ProjectList", m)
		for _, x := range list(m["projects"]) {
			sh.add("Project", x)
		}
	case strings.HasSuffix(p, "/api/projects/mutate"):
		sh.add("Project", m)
	}
}

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %.200s: %v", b, err)
	}
	return v
}

// classify reads one connection's frames (request ids are per connection) and its HTTP exchanges.
func (sh *shapes) classify(t *testing.T, d doc) {
	t.Helper()
	for _, e := range d.Exchanges {
		if len(e.ResponseBody) == 0 || string(e.ResponseBody) == "null" {
			continue
		}
		body := decodeAny(t, e.ResponseBody)
		if s, isStr := body.(string); isStr { // recorded bodies are raw text
			var inner any
			if json.Unmarshal([]byte(s), &inner) != nil {
				continue
			}
			body = inner
		}
		sh.httpBody(e.URL, e.Status, body)
	}
	methods := map[string]string{}
	for _, f := range d.Frames {
		if f.Dir != "send" && f.Dir != "recv" {
			continue
		}
		v := decodeAny(t, []byte(f.Data))
		msgs, isList := v.([]any)
		if !isList {
			msgs = []any{v}
		}
		for _, x := range msgs {
			m, _ := x.(map[string]any)
			tag, _ := m["_tag"].(string)
			if f.Dir == "send" {
				if tag == "Request" {
					methods[fmt.Sprint(m["id"])] = m["tag"].(string)
				}
				continue
			}
			sh.add("S."+tag, m)
			method := methods[fmt.Sprint(m["requestId"])]
			switch tag {
			case "Chunk":
				for _, item := range list(m["values"]) {
					if method == "orchestration.subscribeShell" || method == "orchestration.subscribeArchivedShell" {
						sh.shellItem(item)
					} else {
						sh.threadItem(item)
					}
				}
			case "Exit":
				ex := sh.add("Exit."+str(m, "exit", "_tag"), m["exit"])
				for _, c := range list(ex["cause"]) {
					cm := sh.add("Cause."+str(c.(map[string]any), "_tag"), c)
					if e := cm["error"]; e != nil {
						sh.add("Err."+str(cm, "error", "_tag"), e)
						sh.val("err.tag", str(cm, "error", "_tag"))
					}
				}
				value := ex["value"]
				switch {
				case value == nil:
				case method == "orchestration.getThreadProjection":
					sh.projection(value)
				case method == "orchestration.launchThread":
					sh.projection(sh.add("LaunchResult", value)["projection"])
				case method == "orchestration.dispatchCommand":
					sh.add("DispatchResult", value)
				case method == "server.getConfig":
					cfg := sh.add("ServerConfig", value)
					for _, p := range list(cfg["providers"]) {
						pm := sh.add("Provider", p)
						sh.val("provider.status", pm["status"])
						for _, mo := range list(pm["models"]) {
							mm := sh.add("Model", mo)
							for _, od := range list(path(mm, "capabilities", "optionDescriptors")) {
								om := sh.add("OptionDescriptor", od)
								sh.val("option.type", om["type"])
								for _, oc := range list(om["options"]) {
									sh.add("OptionChoice", oc)
								}
							}
						}
					}
				}
			}
		}
	}
}

func loadFixtures(t *testing.T) *shapes {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(fixtureDir, "t3-v2-pr2829", "*.json"))
	if err != nil || len(files) < 11 {
		t.Fatalf("fixtures in %s: %d files, %v", fixtureDir, len(files), err)
	}
	files = append(files, filepath.Join(fixtureDir, "t3-v2-gate-synthetic.json"))
	sh := newShapes()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d doc
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		sh.classify(t, d)
	}
	return sh
}

// fakeSession drives the fake through what the recordings show (files 01–11 and the gate) and
// returns its traffic, one doc per connection.
func fakeSession(t *testing.T) []doc {
	s := StartT(t, Options{ManualSteps: true, ReadOnlyToken: "ro", HistoryPage: 2})
	httpRec := &recorder{}
	get := func(u string, h map[string]string) { doHTTP(t, httpRec, "GET", s.URL()+u, h, "") }
	tok := s.Token()
	noHeader := map[string]string{"Authorization": "Bearer " + tok}

	// 01–04: descriptor, session, reads on an empty server, tickets, scopes, upgrade refusals.
	get("/.well-known/t3/environment", nil)
	s.SetProtocol(1)
	get("/.well-known/t3/environment", nil)
	s.SetProtocol(2)
	get("/api/auth/session", nil)
	get("/api/auth/session", bearer("not-a-real-token"))
	get("/api/auth/session", bearer(tok))
	get("/api/auth/session", bearer("ro"))
	get("/api/orchestration/shell", nil)
	get("/api/orchestration/shell", bearer("not-a-real-token"))
	get("/api/orchestration/shell", noHeader)
	get("/api/orchestration/shell", bearer(tok))
	get("/api/projects", bearer(tok))
	get("/api/orchestration/threads/thread-does-not-exist", bearer(tok))
	doHTTP(t, httpRec, "POST", s.URL()+"/api/projects/mutate", bearer("ro"), `{"type":"project.create","commandId":"c","projectId":"p-ro","title":"denied","workspaceRoot":"/srv"}`)
	doHTTP(t, httpRec, "POST", s.URL()+"/api/projects/mutate", bearer(tok), `{"type":"project.create","commandId":"c","projectId":"project-fixtures","title":"fixtures","workspaceRoot":"/srv/workspace"}`)
	doHTTP(t, httpRec, "POST", s.URL()+"/api/auth/websocket-ticket", bearer(tok), "")
	doHTTP(t, httpRec, "POST", s.URL()+"/api/auth/websocket-ticket", nil, "")
	s.RefuseTickets(true)
	doHTTP(t, httpRec, "POST", s.URL()+"/api/auth/websocket-ticket", bearer(tok), "")
	s.RefuseTickets(false)
	get("/ws?wsTicket=x", nil)
	get("/ws?orchestrationProtocol=2", nil)
	get("/ws?orchestrationProtocol=2&wsTicket=not-a-real-ticket", nil)
	s.HTTPFail(500)
	get("/api/orchestration/shell", bearer(tok))
	s.HTTPFail(0)
	pid := "project-fixtures"

	// 05: config, shell subscription, a basic run, projection, error exits, replay.
	recA := &recorder{}
	a := dial(t, s, tok, recA)
	a.call("server.getConfig", `{}`)
	shell := a.subscribeReady("orchestration.subscribeShell", `{"requestCompletionMarker":true}`)
	doHTTP(t, httpRec, "POST", s.URL()+"/api/projects/mutate", bearer(tok), `{"type":"project.create","commandId":"c2","projectId":"project-two","title":"two","workspaceRoot":"/srv/two"}`)
	a.waitItem(shell, 0, func(m map[string]any) bool { return m["kind"] == "project.updated" })
	a.call("orchestration.dispatchCommand", createThreadPayload("c-create", "t-basic", pid))
	th := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-basic","requestCompletionMarker":true}`)
	a.call("orchestration.dispatchCommand", dispatchPayload("c-run", "t-basic", "m-basic", "Say hello."))
	s.StepAll()
	a.waitItem(th, 0, isEvent("run.updated", "status", "completed"))
	a.waitItem(shell, 0, isShell("t-basic", "completed"))
	a.call("orchestration.getThreadProjection", `{"threadId":"t-basic"}`)
	a.call("orchestration.dispatchCommand", dispatchPayload("c-x", "thread-does-not-exist", "m-x", "hello?"))
	a.call("orchestration.dispatchCommand", `{"type":"message.dispatch","threadId":"t-basic"}`)
	a.call("orchestration.dispatchCommand", `{"type":"thread.explode","commandId":"c-e","threadId":"t-basic"}`)
	a.call("orchestration.getThreadProjection", `{"threadId":"thread-does-not-exist"}`)
	a.call("orchestration.dispatchCommand", interruptPayload("c-ni", "t-basic", "run-does-not-exist"))
	a.call("orchestration.doesNotExist", `{}`)
	replay := a.subscribe("orchestration.subscribeThread", `{"threadId":"t-basic","afterSequence":5,"requestCompletionMarker":true}`, true)
	a.waitItem(replay, 0, func(m map[string]any) bool { return m["kind"] == "synchronized" })
	a.sendRaw(fmt.Sprintf(`{"_tag":"Interrupt","requestId":%q,"interruptors":[]}`, replay))
	a.exit(replay)

	// 06: a pending question, a wrong id, the answer, a second answer.
	a.call("orchestration.dispatchCommand", createThreadPayload("c-q1", "t-question", pid))
	tq := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-question","requestCompletionMarker":true}`)
	a.call("orchestration.dispatchCommand", dispatchPayload("c-q2", "t-question", "m-q", "Ask me a question."))
	s.StepAll()
	a.waitItem(tq, 0, isEvent("turn-item.updated", "type", "user_input_request"))
	a.waitItem(shell, 0, func(m map[string]any) bool { return path(m, "thread", "pendingRuntimeRequest") != nil })
	reqID := lastEvent(t, a, tq, "runtime-request.updated", "")["id"].(string)
	a.call("orchestration.dispatchCommand", respondPayload("c-q3", "t-question", "request-does-not-exist"))
	a.call("orchestration.dispatchCommand", respondPayload("c-q4", "t-question", reqID))
	s.StepAll()
	a.waitItem(tq, 0, isEvent("run.updated", "status", "completed"))
	a.call("orchestration.dispatchCommand", respondPayload("c-q5", "t-question", reqID))

	// 07: hang and interrupt, twice.
	a.call("orchestration.dispatchCommand", createThreadPayload("c-h1", "t-hang", pid))
	thg := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-hang","requestCompletionMarker":true}`)
	a.call("orchestration.dispatchCommand", dispatchPayload("c-h2", "t-hang", "m-h", "Work forever until interrupted."))
	s.StepAll()
	a.call("orchestration.dispatchCommand", interruptPayload("c-h3", "t-hang", runID("t-hang", 1)))
	s.StepAll()
	a.waitItem(thg, 0, isEvent("run.updated", "status", "interrupted"))
	a.call("orchestration.dispatchCommand", interruptPayload("c-h4", "t-hang", runID("t-hang", 1)))

	// 08: a provider failure.
	a.call("orchestration.dispatchCommand", createThreadPayload("c-f1", "t-fail", pid))
	tf := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-fail","requestCompletionMarker":true}`)
	a.call("orchestration.dispatchCommand", dispatchPayload("c-f2", "t-fail", "m-f", "This prompt will fail."))
	s.StepAll()
	a.waitItem(tf, 0, isEvent("run.updated", "status", "failed"))

	// 18: command approvals answered accept, decline and cancel; 19: a form elicitation.
	decisionPayload := func(cmd, tid, reqID, decision string) string {
		return fmt.Sprintf(`{"type":"runtime-request.respond","commandId":%q,"threadId":%q,"requestId":%q,"decision":%q}`, cmd, tid, reqID, decision)
	}
	for i, decision := range []string{"accept", "decline", "cancel"} {
		tid := fmt.Sprintf("t-approval-%d", i)
		a.call("orchestration.dispatchCommand", createThreadPayload("c-a1-"+decision, tid, pid))
		ta := a.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"requestCompletionMarker":true}`, tid))
		a.call("orchestration.dispatchCommand", dispatchPayload("c-a2-"+decision, tid, "m-a-"+decision, "Ask for approval first."))
		s.StepAll()
		a.waitItem(ta, 0, isEvent("turn-item.updated", "type", "approval_request"))
		req := lastEvent(t, a, ta, "runtime-request.updated", "")["id"].(string)
		a.call("orchestration.dispatchCommand", decisionPayload("c-a3-"+decision, tid, req, decision))
		s.StepAll()
		want := "completed"
		if decision == "cancel" {
			want = "cancelled"
		}
		a.waitItem(ta, 0, isEvent("run.updated", "status", want))
	}
	a.call("orchestration.dispatchCommand", createThreadPayload("c-e1", "t-elicit", pid))
	te := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-elicit","requestCompletionMarker":true}`)
	a.call("orchestration.dispatchCommand", dispatchPayload("c-e2", "t-elicit", "m-e", "Elicit a form."))
	s.StepAll()
	a.waitItem(te, 0, isEvent("turn-item.updated", "type", "user_input_request"))
	ereq := lastEvent(t, a, te, "runtime-request.updated", "")["id"].(string)
	a.call("orchestration.dispatchCommand", fmt.Sprintf(`{"type":"runtime-request.respond","commandId":"c-e3","threadId":"t-elicit","requestId":%q,"answers":{"approved":"true"}}`, ereq))
	s.StepAll()
	a.waitItem(te, 0, isEvent("run.updated", "status", "completed"))

	// 10: launchThread, its run, and a launch onto an existing thread.
	launch := `{"commandId":"c-l","creationSource":"web","threadId":"t-launch","projectId":"` + pid + `","title":"launch","generateTitle":false,"modelSelection":{"instanceId":"codex","model":"gpt-5.6-sol"},"runtimeMode":"full-access","interactionMode":"default","workspaceStrategy":{"type":"root"},"initialMessage":{"text":"Launched with a first message.","attachments":[]}}`
	a.call("orchestration.launchThread", launch)
	tl := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-launch","requestCompletionMarker":true}`)
	s.StepAll()
	a.waitItem(tl, 0, isEvent("run.updated", "status", "completed"))
	a.call("orchestration.launchThread", strings.Replace(launch, "c-l", "c-l2", 1))

	// 20: worktree launches (a new worktree, a bad base ref, an existing worktree).
	for i, ws := range []string{
		`{"type":"worktree","baseRef":"main","branch":"feature-x"}`,
		`{"type":"worktree","baseRef":"no-such-branch","branch":"feature-z"}`,
		`{"type":"existing_worktree","worktreePath":"/srv/workspace-wt-feature-y","branch":"feature-y"}`,
	} {
		tid := fmt.Sprintf("t-wt-%d", i)
		wl := strings.NewReplacer("c-l", fmt.Sprintf("c-wt-%d", i), "t-launch", tid, `{"type":"root"}`, ws).Replace(launch)
		a.call("orchestration.launchThread", wl)
		sub := a.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q,"requestCompletionMarker":true}`, tid))
		s.StepAll()
		status := "completed"
		if i == 1 {
			status = "failed"
		}
		a.waitItem(sub, 0, isEvent("run.updated", "status", status))
	}

	// 21: steer_active and restart_active on the active run; aimed at a queued run they fail.
	a.call("orchestration.dispatchCommand", createThreadPayload("c-st1", "t-steer", pid))
	a.call("orchestration.dispatchCommand", dispatchPayload("c-st2", "t-steer", "m-st1", "hang forever"))
	st := a.subscribeReady("orchestration.subscribeThread", `{"threadId":"t-steer","requestCompletionMarker":true}`)
	s.StepAll()
	a.call("orchestration.dispatchCommand", dispatchPayload("c-st3", "t-steer", "m-st2", "queued behind"))
	run1, run2 := "run:thread:t-steer:ordinal:1", "run:thread:t-steer:ordinal:2"
	steerPayload := func(cmd, msg, mode, target string) string {
		return strings.Replace(dispatchPayload(cmd, "t-steer", msg, "Steer the active run with this message."),
			`"dispatchMode":{"type":"start_immediately"}`, fmt.Sprintf(`"dispatchMode":{"type":%q,"targetRunId":%q}`, mode, target), 1)
	}
	a.call("orchestration.dispatchCommand", steerPayload("c-st4", "m-st3", "restart_active", run2))
	a.call("orchestration.dispatchCommand", steerPayload("c-st5", "m-st4", "restart_active", run1))
	a.call("orchestration.dispatchCommand", steerPayload("c-st6", "m-st5", "steer_active", run1))
	s.StepAll()
	a.waitItem(st, 0, isEvent("run.updated", "status", "completed"))
	a.ping()
	a.sendRaw(fmt.Sprintf(`{"_tag":"Interrupt","requestId":%q,"interruptors":[]}`, shell))
	a.exit(shell)

	// 09: a read-only token.
	recB := &recorder{}
	b := dial(t, s, "ro", recB)
	b.subscribeReady("orchestration.subscribeShell", `{"requestCompletionMarker":true}`)
	b.call("orchestration.dispatchCommand", createThreadPayload("c-ro", "t-ro", pid))
	b.call("orchestration.launchThread", strings.Replace(launch, "c-l", "c-ro2", 1))

	// 11 and the gate: populated reads, bounded, history.
	get("/api/orchestration/shell", bearer(tok))
	get("/api/orchestration/threads/t-basic", bearer(tok))
	get("/api/orchestration/threads/t-question", bearer(tok))
	get("/api/projects", bearer(tok))
	r := doHTTP(t, httpRec, "GET", s.URL()+"/api/orchestration/threads/t-basic/bounded", bearer(tok), "")
	get("/api/orchestration/threads/t-basic/history?cursor="+url.QueryEscape(str(asMap(t, []byte(r.body)), "historyCursor")), bearer(tok))
	get("/api/orchestration/threads/t-basic/history?cursor=garbage", bearer(tok))

	docs := []doc{toDoc(httpRec), toDoc(recA), toDoc(recB)}
	return docs
}

func toDoc(r *recorder) doc {
	var d doc
	b, _ := json.Marshal(map[string]any{"exchanges": r.exchanges, "frames": r.frames})
	_ = json.Unmarshal(b, &d)
	return d
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestShapesMatchRecordings(t *testing.T) {
	rec := loadFixtures(t)
	fake := newShapes()
	for _, d := range fakeSession(t) {
		fake.classify(t, d)
	}

	// The keys every recorded turn item has, for documentedKeys' "+base".
	var base map[string]bool
	for kind, keys := range rec.keys {
		if !strings.HasPrefix(kind, "TurnItem.") {
			continue
		}
		if base == nil {
			base = map[string]bool{}
			for k := range keys {
				base[k] = true
			}
		}
		for k := range base {
			if !keys[k] {
				delete(base, k)
			}
		}
	}

	for _, kind := range mustCover {
		if fake.keys[kind] == nil {
			t.Errorf("the fake never sent a %s", kind)
		}
	}
	for _, kind := range sortedKeys(fake.keys) {
		got := fake.keys[kind]
		want := map[string]bool{}
		for k := range rec.keys[kind] {
			want[k] = true
		}
		doc, documented := documentedKeys[kind]
		for _, k := range doc {
			if k == "+base" {
				for b := range base {
					want[b] = true
				}
				continue
			}
			want[k] = true
		}
		if rec.keys[kind] == nil && !documented {
			t.Errorf("%s: neither recorded nor documented (keys %v)", kind, sortedSet(got))
			continue
		}
		var extra, missing []string
		for k := range got {
			if !want[k] {
				extra = append(extra, k)
			}
		}
		for k := range want {
			if !got[k] {
				missing = append(missing, k)
			}
		}
		sort.Strings(extra)
		sort.Strings(missing)
		if len(extra) > 0 {
			t.Errorf("%s: keys T3 does not send: %v", kind, extra)
		}
		if omitted := slices.Sorted(slices.Values(omittedKeys[kind])); !slices.Equal(missing, omitted) {
			t.Errorf("%s: recorded keys the fake omits are %q, documented as %q", kind, missing, omitted)
		}
	}
	for kind := range omittedKeys {
		if fake.keys[kind] == nil {
			t.Errorf("omittedKeys lists %s, which the fake did not send", kind)
		}
	}

	for _, kind := range sortedKeys(fake.vals) {
		for v := range fake.vals[kind] {
			if !rec.vals[kind][v] && !slices.Contains(documentedValues[kind], v) {
				t.Errorf("%s: value %q was never recorded", kind, v)
			}
		}
	}
}
