module github.com/t3code-mcp/t3code-mcp/scripts/tracejoin

go 1.26.0

require (
	github.com/t3code-mcp/t3code-mcp/scripts/gcmarks v0.0.0
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
)

replace github.com/t3code-mcp/t3code-mcp/scripts/gcmarks => ../gcmarks
