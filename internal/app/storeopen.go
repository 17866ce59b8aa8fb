package app

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

// openTimeout bounds connecting to (and migrating) the database at start.
const openTimeout = 30 * time.Second

// checkDatabaseURL checks T3CODE_MCP_DATABASE_URL's form. The error never repeats the URL: it
// holds the database password.
func checkDatabaseURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return errors.New("T3CODE_MCP_DATABASE_URL must be a postgres://user:password@host:port/database URL")
	}
	return nil
}

// OpenStore opens the store the settings select: PostgreSQL when DatabaseURL is set (shared by
// every replica, migrated at open), else the bbolt file in StateDir. Errors name the setting to
// fix and never hold the database password.
func OpenStore(s Settings) (store.Store, error) {
	if s.DatabaseURL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		defer cancel()
		st, err := pgstore.Open(ctx, s.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("database (T3CODE_MCP_DATABASE_URL): %w", err)
		}
		return st, nil
	}
	st, err := store.Open(s.StateDir)
	if err != nil {
		return nil, fmt.Errorf("state directory %s (T3CODE_MCP_STATE_DIR): %w", s.StateDir, err)
	}
	return st, nil
}
