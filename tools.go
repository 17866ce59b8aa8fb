// Package t3codemcp is the root of the t3code-mcp module. It holds no code: this file is the one
// place where `go generate` (run by `make generate`) compiles the hand-written contracts under
// schema/ into the typed code under gen/, and writes the JSON Schema of t3code.toml from the config
// types into schema/config/. The generators are pinned in go.mod's tool block and run
// with `go tool`, so a fresh clone needs nothing installed but Go.
//
// After a T3 protocol bump: edit schema/, run `make generate`, then `make check`; the compiler and
// the contract tests in internal/contract show what broke.
package t3codemcp

// T3's HTTP reads: an ogen client plus the read-model types (schema/t3/model.json).
//go:generate go tool ogen -config schema/t3/ogen.yml -target gen/t3api -package t3api -clean schema/t3/openapi.yaml

// T3's Effect RPC envelope, stream items, commands and failures.
//go:generate go tool jschemagen -target gen/t3rpc/rpc_gen.go -package t3rpc -typename Root schema/t3/rpc.json

// The MCP tools' inputs and outputs: Go types, then each tool's self-contained JSON Schemas as data.
//go:generate go tool jschemagen -target gen/mcptools/tools_gen.go -package mcptools -typename Root schema/mcp/tools.json
//go:generate go run ./internal/generators/mcpschema -in schema/mcp/tools.json -out gen/mcptools/schemas_gen.go -package mcptools

// The webhook event t3code-mcp delivers (docs/events.md).
//go:generate go tool jschemagen -target gen/events/event_gen.go -package events -typename Event schema/events/event.json

// The JSON Schema of t3code.toml, from internal/config's types, for editors (docs/configuration.md).
//go:generate go run ./internal/generators/configschema -out schema/config/t3code.schema.json
