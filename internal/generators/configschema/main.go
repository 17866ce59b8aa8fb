// Command configschema writes the JSON Schema of t3code.toml (config.JSONSchema, the same bytes
// `t3code-mcp config-schema` prints) to a file. `go generate` runs it from tools.go; scripts/gencheck
// fails when the committed schema/config/t3code.schema.json differs from what it writes.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
)

func main() {
	out := flag.String("out", "", "the file to write")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: configschema -out FILE")
		os.Exit(2)
	}
	b, err := config.JSONSchema()
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "configschema:", err)
		os.Exit(1)
	}
}
