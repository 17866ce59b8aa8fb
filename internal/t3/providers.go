package t3

import "github.com/t3code-mcp/t3code-mcp/gen/t3rpc"

// ProviderUsable reports whether a machine's provider can run a thread now: enabled, ready and
// not reported unavailable (fields a server leaves out count as usable). t3_dispatch picks models
// of usable providers only, and doctor says which are not.
func ProviderUsable(p t3rpc.Provider) bool {
	if !p.Enabled.Or(true) {
		return false
	}
	if st, ok := p.Status.Get(); ok && st != "ready" {
		return false
	}
	if a, ok := p.Availability.Get(); ok && a == "unavailable" {
		return false
	}
	return true
}
