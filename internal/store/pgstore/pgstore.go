// Package pgstore is the PostgreSQL backend of store.Store: the connector's tracked threads,
// detector state and outbox in one database that several replicas share
// (T3CODE_MCP_DATABASE_URL). It passes the same contract suite as the bbolt file
// (internal/store/storetest).
//
// Schema: numbered SQL files embedded from migrations/ (NNNN_name.sql), applied at Open in one
// transaction under an advisory lock, so replicas starting together migrate once; the applied
// version is kept in t3_schema_version. A database migrated by a newer binary is refused.
//
// Order: event sequence numbers are drawn while the inserting transaction holds an advisory
// lock (eventsLock) until it commits, so they are assigned in commit order and a reader that saw
// everything up to n finds everything newer with PendingAfter(n), whichever replica committed it.
//
// The database URL's password never appears in an error or in Location: errors from pgx are
// passed through redact.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// opTimeout bounds every store call: the store.Store methods take no context, and a database
// that stopped answering must surface as an error (the watcher and outbox retry), not a hang.
const opTimeout = 30 * time.Second

// Store is the PostgreSQL store. It is safe for concurrent use, by several processes too.
type Store struct {
	pool     *pgxpool.Pool
	location string // the URL without its password
	secret   string // the password, redacted from every error
}

var _ store.Store = (*Store)(nil)

// Open connects to the database the URL names (postgres://…), applies the migrations it lacks
// and returns the store.
func Open(ctx context.Context, databaseURL string) (*Store, error) {
	s, err := connect(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	if err := Migrate(ctx, s.pool); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("store: %s: %w", s.location, s.redact(err))
	}
	return s, nil
}

// connect makes the pool; it connects lazily (Open's migration, or Connect's ping, is the
// first use).
func connect(ctx context.Context, databaseURL string) (*Store, error) {
	loc, secret := describe(databaseURL)
	s := &Store{location: loc, secret: secret}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("store: T3CODE_MCP_DATABASE_URL is not a valid PostgreSQL URL: %w", s.redact(err))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", loc, s.redact(err))
	}
	s.pool = pool
	return s, nil
}

// Pool is the store's connection pool (the lease manager shares it).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Location is the database URL without its password (Store.Location).
func (s *Store) Location() string { return s.location }

// Close closes the pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// describe returns the URL with its password replaced, and the password.
func describe(databaseURL string) (location, secret string) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "postgres://(unparsable URL)", ""
	}
	if p, ok := u.User.Password(); ok {
		secret = p
	}
	if q := u.Query(); q.Has("password") {
		secret = q.Get("password")
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted(), secret
}

// redactedError keeps errors.Is/As working on an error whose text had the password removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

func (s *Store) redact(err error) error {
	if err == nil || s.secret == "" || !strings.Contains(err.Error(), s.secret) {
		return err
	}
	return &redactedError{msg: strings.ReplaceAll(err.Error(), s.secret, "xxxxx"), err: err}
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// tx runs fn in a read-committed transaction, committed when fn returns nil.
func (s *Store) tx(fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, cancel := s.ctx()
	defer cancel()
	return s.redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return fn(ctx, tx) }))
}

// ---- threads ----

// PutThread inserts or replaces a tracked thread.
func (s *Store) PutThread(t store.Thread) error {
	if t.ID == "" || t.Machine == "" {
		return errors.New("store: a thread needs an ID and a Machine")
	}
	return s.tx(func(ctx context.Context, tx pgx.Tx) error { return putThread(ctx, tx, t) })
}

func putThread(ctx context.Context, tx pgx.Tx, t store.Thread) error {
	_, err := tx.Exec(ctx, upsertThread, t.ID, t.Machine, t)
	return err
}

// queueThread queues putThread's upsert in a batch.
func queueThread(b *pgx.Batch, t store.Thread) { b.Queue(upsertThread, t.ID, t.Machine, t) }

const upsertThread = `INSERT INTO t3_threads (id, machine, data) VALUES ($1, $2, $3)
	ON CONFLICT (id) DO UPDATE SET machine = excluded.machine, data = excluded.data`

// GetThread returns a tracked thread.
func (s *Store) GetThread(id string) (store.Thread, bool, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var t store.Thread
	err := s.pool.QueryRow(ctx, `SELECT data FROM t3_threads WHERE id = $1`, id).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Thread{}, false, nil
	}
	return t, err == nil, s.redact(err)
}

// GetThreads returns the tracked threads among ids, by id, in one query.
func (s *Store) GetThreads(ids []string) (map[string]store.Thread, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT data FROM t3_threads WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, s.redact(err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowTo[store.Thread])
	if err != nil {
		return nil, s.redact(err)
	}
	out := make(map[string]store.Thread, len(list))
	for _, t := range list {
		out[t.ID] = t
	}
	return out, nil
}

// DeleteThread stops tracking a thread; deleting an unknown id is not an error.
func (s *Store) DeleteThread(id string) error {
	ctx, cancel := s.ctx()
	defer cancel()
	_, err := s.pool.Exec(ctx, `DELETE FROM t3_threads WHERE id = $1`, id)
	return s.redact(err)
}

// ListThreads returns every tracked thread, oldest first (CreatedAt, then ID).
func (s *Store) ListThreads() ([]store.Thread, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT data FROM t3_threads`)
	if err != nil {
		return nil, s.redact(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[store.Thread])
	if err != nil {
		return nil, s.redact(err)
	}
	store.SortThreads(out)
	return out, nil
}

// ---- detector state ----

// Detector returns the detector state stored under key.
func (s *Store) Detector(key string) ([]byte, bool, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var v []byte
	err := s.pool.QueryRow(ctx, `SELECT value FROM t3_detector WHERE key = $1`, []byte(key)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return v, err == nil, s.redact(err)
}

// ForEachDetector calls fn with every detector key and value, in key (byte) order. The rows are
// read first, so fn runs without holding a connection.
func (s *Store) ForEachDetector(fn func(key string, value []byte) error) error {
	ctx, cancel := s.ctx()
	defer cancel()
	type kv struct{ k, v []byte }
	rows, err := s.pool.Query(ctx, `SELECT key, value FROM t3_detector ORDER BY key`)
	if err != nil {
		return s.redact(err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv, error) {
		var x kv
		err := r.Scan(&x.k, &x.v)
		return x, err
	})
	if err != nil {
		return s.redact(err)
	}
	for _, x := range all {
		if err := fn(string(x.k), x.v); err != nil {
			return err
		}
	}
	return nil
}
