package pgstore_test

import (
	"context"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
)

// open opens a store on a fresh database of this test's own.
func open(t *testing.T) (*pgstore.Store, string) {
	t.Helper()
	url := pgtest.New(t)
	s, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, url
}

// TestContract runs the store contract suite on PostgreSQL (a fresh database per test).
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func(t *testing.T) store.Store) {
		s, url := open(t)
		return s, func(t *testing.T) store.Store {
			s.Close()
			s2, err := pgstore.Open(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			return s2
		}
	})
}
