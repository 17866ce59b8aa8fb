package main

import (
	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/memreturn"
)

// heapReserve is the warm reserve the process keeps while quiet (T3CODE_MCP_HEAP_RESERVE_MB),
// and false when GOGC is set in the environment: the operator chose the collector's goal, and it
// is left alone (the spare memory is still returned, all of it), as GOMAXPROCS is (procs.go).
func heapReserve(s app.Settings, getenv func(string) string) (uint64, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return uint64(s.HeapReserveMB) << 20, true
}

// setHeapReserve applies heapReserve to the process's heap policy before anything starts (the
// snapshot gate settles it at the end of start-up) and logs it.
func (c *cli) setHeapReserve(s app.Settings) {
	bytes, ours := heapReserve(s, c.getenv)
	memreturn.Process.SetReserve(bytes)
	if !ours {
		c.log.Info("Go heap: no warm reserve", "from", "GOGC")
		return
	}
	c.log.Debug("Go heap: warm reserve while quiet", "mb", s.HeapReserveMB)
}
