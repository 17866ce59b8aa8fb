package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/audit"
)

var (
	_ audit.Table  = (*Store)(nil)
	_ audit.Pruner = (*Store)(nil)
)

// ErrNoAuditTable: the database's schema predates the audit table (a connector of this version
// migrates it at start).
var ErrNoAuditTable = errors.New("the database has no audit table yet (schema before 4): start a connector of this version once to migrate it")

// AppendAudit stores audit records in one statement; a record whose line is already stored is
// skipped (audit.Table).
func (s *Store) AppendAudit(ctx context.Context, recs []audit.Record) error {
	if len(recs) == 0 {
		return nil
	}
	n := len(recs)
	at := make([]time.Time, 0, n)
	tool, machine, thread, replica := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	lines, digests := make([][]byte, 0, n), make([][]byte, 0, n)
	for _, r := range recs {
		line, err := r.Line()
		if err != nil {
			return err
		}
		sum := sha256.Sum256(line)
		at = append(at, r.Time)
		tool, machine, thread, replica = append(tool, r.Tool), append(machine, r.Machine), append(thread, r.Thread), append(replica, r.Replica)
		lines, digests = append(lines, line), append(digests, sum[:])
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO t3_audit (at, tool, machine, thread, replica, line, digest)
		SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[])
		ON CONFLICT (digest) DO NOTHING`, at, tool, machine, thread, replica, lines, digests)
	return s.redact(err)
}

// PruneAudit deletes the audit records written before before and returns how many
// (audit.KeepFor, T3CODE_MCP_AUDIT_RETENTION). Any replica may run it at any time: rows past a
// cutoff are deleted once, whoever gets there first (the index on at finds them).
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM t3_audit WHERE at < $1`, before)
	if err != nil {
		return 0, s.redact(err)
	}
	return int(tag.RowsAffected()), nil
}

// ScanAudit calls fn with the stored audit records f matches, oldest first (the Source of
// `t3code-mcp audit` with a database URL). Rows whose line does not decode are counted in bad.
func (s *Store) ScanAudit(ctx context.Context, f audit.Filter, fn func(line []byte, r audit.Record) error) (bad int, err error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('t3_audit') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, s.redact(err)
	}
	if !exists {
		return 0, ErrNoAuditTable
	}
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	rows, err := s.pool.Query(ctx, `SELECT line FROM t3_audit
		WHERE ($1 = '' OR machine = $1) AND ($2 = '' OR thread = $2) AND ($3::timestamptz IS NULL OR at >= $3)
		ORDER BY at, seq`, f.Machine, f.Thread, since)
	if err != nil {
		return 0, s.redact(err)
	}
	defer rows.Close()
	var line []byte
	for rows.Next() {
		if err := rows.Scan(&line); err != nil {
			return bad, s.redact(err)
		}
		r, ok := audit.Decode(line)
		if !ok {
			bad++
			continue
		}
		if !f.Match(r) {
			continue
		}
		if err := fn(line, r); err != nil {
			return bad, err
		}
	}
	if err := rows.Err(); err != nil {
		return bad, fmt.Errorf("reading the audit table: %w", s.redact(err))
	}
	return bad, nil
}
