module github.com/t3code-mcp/t3code-mcp/scripts/gcmarks

go 1.26.0
