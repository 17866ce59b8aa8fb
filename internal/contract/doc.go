// Package contract holds tests only: they check the generated code under gen/ against what T3
// really sends and against the contracts t3code-mcp publishes.
//
//   - Every recorded HTTP body and WebSocket frame in testdata/t3 decodes with the generated types
//     (gen/t3api, gen/t3rpc), and every command t3code-mcp would send has the recorded shape.
//   - A schema change that breaks decoding is caught by `go generate` + these tests, not at run time.
//   - The MCP tool schemas (gen/mcptools) match their golden files in testdata/toolschemas; run
//     `go test ./internal/contract/ -run TestToolSchemas -update` after a deliberate change.
//   - The webhook event (gen/events) matches docs/events.md, signature example included.
package contract
