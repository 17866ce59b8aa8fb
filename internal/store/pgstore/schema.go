package pgstore

import (
	"context"
	"fmt"
)

// Connect connects to the database without migrating it, for commands that only read (doctor,
// audit): a check must not change the database. The store's other methods need the schema
// Open applies; see Schema.
func Connect(ctx context.Context, databaseURL string) (*Store, error) {
	s, err := connect(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	if err := s.pool.Ping(ctx); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("store: %s: %w", s.location, s.redact(err))
	}
	return s, nil
}

// Schema is the database's schema version against this binary's migrations.
type Schema struct {
	Version int      // applied (0: none, a fresh database)
	Latest  int      // what this binary's migrations reach
	Pending []string // the migrations a start of this binary would apply, in order
}

// Schema reads the applied schema version and lists the migrations not applied yet, changing
// nothing. Version > Latest: a newer binary migrated the database (this one refuses it).
func (s *Store) Schema(ctx context.Context) (Schema, error) {
	all, err := steps()
	if err != nil {
		return Schema{}, err
	}
	out := Schema{Latest: len(all)}
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('t3_schema_version') IS NOT NULL`).Scan(&exists); err != nil {
		return Schema{}, s.redact(err)
	}
	if exists {
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM t3_schema_version`).Scan(&out.Version); err != nil {
			return Schema{}, s.redact(err)
		}
	}
	for _, st := range all {
		if st.version > out.Version {
			out.Pending = append(out.Pending, st.name)
		}
	}
	return out, nil
}
