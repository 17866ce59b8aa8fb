package main

import (
	"github.com/spf13/cobra"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
)

func (c *cli) configSchemaCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "config-schema",
		Short: "print the JSON Schema of t3code.toml (for editor completion and checking)",
		Long: `Print the JSON Schema of t3code.toml on stdout: the keys of each [machines.NAME] table, their
types, allowed values and descriptions. TOML editors that read JSON Schema (Taplo, the Even Better
TOML extension) use it to complete and check the file: save it, then put
"#:schema ./t3code.schema.json" on the first line of t3code.toml. The same schema is committed as
schema/config/t3code.schema.json (docs/configuration.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := config.JSONSchema()
			if err != nil {
				return err
			}
			_, err = c.stdout.Write(out)
			return err
		},
	}
}
