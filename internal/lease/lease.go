// Package lease decides which replica detects events for which T3 machine when several replicas
// share one PostgreSQL database (docs/deploy.md): one lease per machine, held by at most one
// replica at a time, renewed well within its TTL, taken over by another replica when it expires,
// and spread over the live replicas.
//
// A lease is a row (t3_machine_leases: machine, holder, expires_at, token), not an advisory lock
// on a held connection, for two reasons:
//   - fencing: every event commit checks, in its own transaction, that the machine's token is
//     still the one this replica acquired (store.Fence, checked by the PostgreSQL store under
//     FOR SHARE). An advisory lock belongs to one server session; a commit made on another pooled
//     connection cannot prove it still holds it, and a holder whose connection the server has not
//     yet noticed is dead would keep the lock for the length of a TCP timeout, not a bounded TTL;
//   - a bounded, configurable takeover time: expiry is a timestamp compared with the database's
//     own clock (now()), the one clock all replicas share, so clock skew between replicas does
//     not matter and the TTL (T3CODE_MCP_LEASE_TTL) is the bound.
//
// The token grows by one at every acquisition, so a replica that lost its lease (paused, cut off)
// and comes back can never commit under the new holder's tenure.
//
// Spreading: every replica keeps a heartbeat row (t3_replicas) alive; a replica holds at most
// ceil(machines / live replicas) leases, releases the excess when more replicas come up, and takes
// free or expired leases up to that share, so the machines end up spread and no replica takes
// more than its share while the others are live.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// DefaultTTL is how long a lease lives without renewal. The holder renews every TTL/3, so it
// survives two failed renewals in a row; another replica takes an expired lease at its next
// tick, so a dead holder's machines move within TTL + TTL/3 (8 s by default, under the 10 s the
// deployment guide promises).
const DefaultTTL = 6 * time.Second

// Options configure a Manager.
type Options struct {
	Pool *pgxpool.Pool
	// Replica identifies this process among the replicas (default: host-pid-random).
	Replica string
	// Machines are the configured machine names (the same on every replica).
	Machines []string
	// TTL is how long a lease lives without renewal (default DefaultTTL).
	TTL    time.Duration
	Logger *slog.Logger
	// OnAcquire is called, from Run's goroutine and after Held reports the lease, each time this
	// replica gains a machine's lease (the detector catches up there). It must not block long.
	OnAcquire func(machine string, token int64)
	// OnRelease is called when this replica lost or gave up a machine's lease (Held already
	// reports false).
	OnRelease func(machine string)
}

// Manager holds this replica's leases.
type Manager struct {
	o        Options
	interval time.Duration

	mu   sync.Mutex
	held map[string]held
}

type held struct {
	token    int64
	deadline time.Time // local monotonic time until which the lease is certainly ours
}

// New makes a Manager; Run acquires and renews.
func New(o Options) *Manager {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Replica == "" {
		o.Replica = DefaultReplicaID()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.OnAcquire == nil {
		o.OnAcquire = func(string, int64) {}
	}
	if o.OnRelease == nil {
		o.OnRelease = func(string) {}
	}
	o.Machines = slices.Clone(o.Machines)
	slices.Sort(o.Machines)
	o.Machines = slices.Compact(o.Machines)
	return &Manager{o: o, interval: o.TTL / 3, held: map[string]held{}}
}

// DefaultReplicaID names this process: host name, pid and a random suffix (a restarted replica
// is a new one).
func DefaultReplicaID() string {
	h, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), hex.EncodeToString(b))
}

// Replica is this replica's id.
func (m *Manager) Replica() string { return m.o.Replica }

// Held reports whether this replica holds the machine's lease now, and its fencing token. It
// turns false by itself when renewals have failed for a TTL, before any other replica can have
// taken the lease. Once it has reported a token gone it never reports that token again: a
// renewal that gets through after the local deadline gives the lease up, and it comes back (if
// at all) under a new token with OnAcquire, so that what was passed over meanwhile is caught up.
func (m *Manager) Held(machine string) (token int64, ok bool) {
	m.mu.Lock()
	h, ok := m.held[machine]
	m.mu.Unlock()
	if !ok || !time.Now().Before(h.deadline) {
		return 0, false
	}
	return h.token, true
}

// Holding lists the machines whose lease this replica holds now.
func (m *Manager) Holding() []string {
	var out []string
	for _, name := range m.o.Machines {
		if _, ok := m.Held(name); ok {
			out = append(out, name)
		}
	}
	return out
}

// Run heartbeats, renews, rebalances and acquires every TTL/3 until ctx ends, then releases the
// leases it holds so that the other replicas take them at once.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	first := true
	for {
		if err := m.tick(ctx, !first); err != nil && ctx.Err() == nil {
			m.o.Logger.Warn("lease renewal failed; retrying", "replica", m.o.Replica, "err", err)
		}
		m.expireLocal()
		first = false
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), m.interval)
			m.releaseAll(rctx)
			cancel()
			return
		case <-t.C:
		}
	}
}

// tick is one round. acquire is false on the first round: a replica that just started waits one
// interval with its heartbeat in place, so replicas starting together see each other before
// they divide the machines.
func (m *Manager) tick(ctx context.Context, acquire bool) error {
	ctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	start := time.Now()
	ttl := m.o.TTL.Seconds()
	if _, err := m.o.Pool.Exec(ctx, `INSERT INTO t3_replicas (id, expires_at) VALUES ($1, now() + make_interval(secs => $2))
		ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at`, m.o.Replica, ttl); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if _, err := m.o.Pool.Exec(ctx, `INSERT INTO t3_machine_leases (machine) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, m.o.Machines); err != nil {
		return fmt.Errorf("lease rows: %w", err)
	}
	if err := m.renew(ctx, start); err != nil {
		return err
	}
	var live int
	if err := m.o.Pool.QueryRow(ctx, `SELECT count(*) FROM t3_replicas WHERE expires_at > now()`).Scan(&live); err != nil {
		return fmt.Errorf("count replicas: %w", err)
	}
	share := (len(m.o.Machines) + max(live, 1) - 1) / max(live, 1)
	mine := m.Holding()
	if len(mine) > share {
		return m.release(ctx, mine[share:])
	}
	if !acquire || len(mine) == share {
		return nil
	}
	return m.acquire(ctx, start, share-len(mine))
}

// renew extends every lease this replica holds; one no longer ours is dropped.
func (m *Manager) renew(ctx context.Context, start time.Time) error {
	m.mu.Lock()
	names := make([]string, 0, len(m.held))
	for name := range m.held {
		names = append(names, name)
	}
	m.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	got, err := m.grants(ctx, `UPDATE t3_machine_leases SET expires_at = now() + make_interval(secs => $3)
		WHERE machine = ANY($1) AND holder = $2 RETURNING machine, token`, names, m.o.Replica, m.o.TTL.Seconds())
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	renewed := map[string]int64{}
	for _, g := range got {
		renewed[g.Machine] = g.Token
	}
	var lost, lapsed []string
	var lapsedTokens []int64
	m.mu.Lock()
	// Read under mu: no Held call falls between this reading and the decision below.
	now := time.Now()
	for _, name := range names {
		h, ok := m.held[name]
		if !ok {
			continue
		}
		switch tok, ok := renewed[name]; {
		case !ok || tok != h.token:
			lost = append(lost, name)
			delete(m.held, name)
		case !now.Before(h.deadline):
			// The renewal came after the local deadline: Held has been saying the lease was
			// gone, and the detector passed the machine's chunks over meanwhile. Resuming under
			// the same token would tell it its tenure never ended, and those chunks would never
			// be judged. The lease is given up and taken again (in this tick's acquire, or by
			// another replica) under a new token, so its holder catches up (OnAcquire).
			lapsed = append(lapsed, name)
			lapsedTokens = append(lapsedTokens, h.token)
			delete(m.held, name)
		default:
			h.deadline = start.Add(m.o.TTL)
			m.held[name] = h
		}
	}
	m.mu.Unlock()
	for _, name := range lost {
		m.o.Logger.Warn("machine lease lost to another replica", "machine", name, "replica", m.o.Replica)
		m.o.OnRelease(name)
	}
	for _, name := range lapsed {
		m.o.Logger.Warn("machine lease renewed after it had lapsed locally; taking it again under a new token", "machine", name, "replica", m.o.Replica)
		m.o.OnRelease(name)
	}
	return m.expire(ctx, lapsed, lapsedTokens)
}

// grant is a lease row a query returned.
type grant struct {
	Machine string
	Token   int64
}

func (m *Manager) grants(ctx context.Context, sql string, args ...any) ([]grant, error) {
	rows, err := m.o.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[grant])
}

// acquire takes up to n free or expired leases. The order is a hash of machine and replica, so
// replicas acquiring at once mostly reach for different machines; SKIP LOCKED lets them pass
// over the rows another replica is taking right now.
func (m *Manager) acquire(ctx context.Context, start time.Time, n int) error {
	got, err := m.grants(ctx, `WITH free AS (
			SELECT machine FROM t3_machine_leases
			WHERE machine = ANY($1) AND expires_at <= now()
			ORDER BY md5(machine || $2) LIMIT $3 FOR UPDATE SKIP LOCKED)
		UPDATE t3_machine_leases l SET holder = $2, token = l.token + 1, expires_at = now() + make_interval(secs => $4)
		FROM free WHERE l.machine = free.machine RETURNING l.machine, l.token`, m.o.Machines, m.o.Replica, n, m.o.TTL.Seconds())
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	m.mu.Lock()
	for _, g := range got {
		m.held[g.Machine] = held{token: g.Token, deadline: start.Add(m.o.TTL)}
	}
	m.mu.Unlock()
	for _, g := range got {
		m.o.Logger.Info("machine lease acquired: this replica detects its events", "machine", g.Machine, "replica", m.o.Replica, "token", g.Token)
		m.o.OnAcquire(g.Machine, g.Token)
	}
	return nil
}

// release gives leases up: first locally (Held turns false, detection stops), then in the
// database (expired at once, so another replica takes them at its next tick).
func (m *Manager) release(ctx context.Context, names []string) error {
	m.mu.Lock()
	tokens := make([]int64, 0, len(names))
	for _, name := range names {
		tokens = append(tokens, m.held[name].token)
		delete(m.held, name)
	}
	m.mu.Unlock()
	for _, name := range names {
		m.o.OnRelease(name)
	}
	return m.expire(ctx, names, tokens)
}

// expire ends leases in the database at once (each only while it still carries this replica's
// token), so that a replica takes them at its next acquire.
func (m *Manager) expire(ctx context.Context, names []string, tokens []int64) error {
	var errs []error
	for i, name := range names {
		if _, err := m.o.Pool.Exec(ctx, `UPDATE t3_machine_leases SET expires_at = '-infinity'
			WHERE machine = $1 AND holder = $2 AND token = $3`, name, m.o.Replica, tokens[i]); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// releaseAll ends this replica: its leases and its heartbeat go, so the others rebalance now
// instead of after a TTL.
func (m *Manager) releaseAll(ctx context.Context) {
	if err := m.release(ctx, m.Holding()); err != nil {
		m.o.Logger.Warn("could not release the machine leases; they expire by themselves", "err", err)
	}
	if _, err := m.o.Pool.Exec(ctx, `DELETE FROM t3_replicas WHERE id = $1`, m.o.Replica); err != nil {
		m.o.Logger.Debug("could not remove the replica heartbeat", "err", err)
	}
}

// expireLocal drops leases whose local deadline passed (renewals failed for a TTL): the
// database may hand them to another replica from now on.
func (m *Manager) expireLocal() {
	now := time.Now()
	m.dropWhere("machine lease expired: renewals failed; another replica may take it", func(_ string, h *held) bool {
		return !now.Before(h.deadline)
	})
}

// dropWhere forgets the leases lose picks (lose may update the others' entries), then says so.
func (m *Manager) dropWhere(why string, lose func(name string, h *held) bool) {
	var gone []string
	m.mu.Lock()
	for name, h := range m.held {
		if lose(name, &h) {
			delete(m.held, name)
			gone = append(gone, name)
			continue
		}
		m.held[name] = h
	}
	m.mu.Unlock()
	for _, name := range gone {
		m.o.Logger.Warn(why, "machine", name, "replica", m.o.Replica)
		m.o.OnRelease(name)
	}
}

// ClaimRemoved takes, for one prune, the lease of a machine this replica is not configured
// with (one removed from t3code.toml): no replica detects it any more, so without this its
// left-over tracked threads and detector state would never be pruned. It succeeds only while no
// replica holds a live lease on the machine — a replica still configured with it (a rolling
// change of the configuration) keeps detecting and pruning it itself — and under a new token, so
// the prune's batch is fenced like a holder's: should a replica configured with the machine
// take it over afterwards, it catches up from what the database holds then. release ends the
// claim at once (expired, while it still carries the claim's token). ok is false for a machine
// this replica is configured with, or one a replica holds.
func (m *Manager) ClaimRemoved(ctx context.Context, machine string) (token int64, release func(context.Context) error, ok bool, err error) {
	if _, configured := slices.BinarySearch(m.o.Machines, machine); configured {
		return 0, nil, false, nil
	}
	// A machine never configured on this database (its state copied by migrate-store) has no
	// row yet: one is made, free.
	if _, err := m.o.Pool.Exec(ctx, `INSERT INTO t3_machine_leases (machine) VALUES ($1) ON CONFLICT DO NOTHING`, machine); err != nil {
		return 0, nil, false, fmt.Errorf("claim removed machine %s: %w", machine, err)
	}
	got, err := m.grants(ctx, `UPDATE t3_machine_leases SET holder = $2, token = token + 1,
			expires_at = now() + make_interval(secs => $3)
		WHERE machine = $1 AND expires_at <= now() RETURNING machine, token`, machine, m.o.Replica, m.o.TTL.Seconds())
	if err != nil {
		return 0, nil, false, fmt.Errorf("claim removed machine %s: %w", machine, err)
	}
	if len(got) == 0 {
		return 0, nil, false, nil // a replica holds it
	}
	token = got[0].Token
	return token, func(ctx context.Context) error { return m.expire(ctx, []string{machine}, []int64{token}) }, true, nil
}

// ErrFenced says a commit carried a fencing token that is no longer the machine's: another
// replica took the lease meanwhile, and only its commits count.
// It is store.ErrFenced, so the store's callers need not know this package.
var ErrFenced = store.ErrFenced

// Querier is what CheckFence needs of a transaction (pgx.Tx).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckFence is the fencing check every event commit of a lease holder makes inside its own
// transaction, before writing: the machine's token must still be token. It locks the lease row
// FOR SHARE, so a takeover (which updates the row) waits until this transaction ends: the commit
// lands entirely before the new holder's tenure or fails here.
func CheckFence(ctx context.Context, tx Querier, machine string, token int64) error {
	return fenced(tx.QueryRow(ctx, fenceQuery, machine), machine, token)
}

// QueueFence queues CheckFence's check in a batch of a commit's statements (sent in one round
// trip with them): the batch's Close returns its error, and the transaction must then roll back,
// undoing whatever the batch wrote after it.
func QueueFence(b *pgx.Batch, machine string, token int64) {
	b.Queue(fenceQuery, machine).QueryRow(func(row pgx.Row) error { return fenced(row, machine, token) })
}

const fenceQuery = `SELECT token FROM t3_machine_leases WHERE machine = $1 FOR SHARE`

func fenced(row pgx.Row, machine string, token int64) error {
	var cur int64
	err := row.Scan(&cur)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && cur != token) {
		return fmt.Errorf("machine %q (token %d): %w", machine, token, ErrFenced)
	}
	return err
}
