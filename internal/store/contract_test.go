package store_test

import (
	"path/filepath"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
)

// TestContract runs the store contract suite on the bbolt backend (a real file per test).
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func(t *testing.T) store.Store) {
		dir := filepath.Join(t.TempDir(), "state")
		s, err := store.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s, func(t *testing.T) store.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2, err := store.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			return s2
		}
	})
}
