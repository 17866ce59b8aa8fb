// A module of its own: golang.org/x/exp/trace (the Go 1.26 trace reader) is newer than the
// x/exp the main module's generator tools pin.
module github.com/t3code-mcp/t3code-mcp/scripts/wakejoin

go 1.26.0

require (
	github.com/t3code-mcp/t3code-mcp/scripts/gcmarks v0.0.0
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
)

replace github.com/t3code-mcp/t3code-mcp/scripts/gcmarks => ../gcmarks
