package outbox

// Counter reports how many events are in each state (the store's Counts).
type Counter interface {
	Counts() (pending, dead, delivered int, err error)
}

// Health is the outbox's part of /healthz, its "events" block: off, and why, when no hook URL is
// set; otherwise how many events wait for delivery and how many are dead letters.
func Health(st Counter, hookConfigured bool) map[string]any {
	if !hookConfigured {
		return map[string]any{"events": map[string]any{"enabled": false, "reason": "T3CODE_MCP_HOOK_URL is not set: no events are produced (t3_wait still works)"}}
	}
	pending, dead, _, err := st.Counts()
	ev := map[string]any{"enabled": true, "pending": pending, "dead_letters": dead}
	if err != nil {
		ev["error"] = err.Error()
	}
	return map[string]any{"events": ev}
}
