package app

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/lease"
)

// pooled is a store backed by PostgreSQL (internal/store/pgstore): several replicas may share it,
// so event detection is divided among them by machine leases (internal/lease, docs/deploy.md).
type pooled interface{ Pool() *pgxpool.Pool }

// replication is this replica's part in a shared deployment: the machine leases, and the
// catch-up of each machine whose lease it gains. Every replica serves /mcp and watches every
// machine; only detection follows the leases.
type replication struct {
	leases *lease.Manager
	fleet  *fleet.Fleet
	ttl    time.Duration // the leases' (bounds claimRemoved's round trips)
	log    *slog.Logger

	mu  sync.Mutex
	ctx context.Context // Run's, for the catch-ups started from lease callbacks
	wg  sync.WaitGroup  // the catch-ups in flight
}

func newReplication(p pooled, fl *fleet.Fleet, s Settings, a *App, replicaID string) *replication {
	r := &replication{fleet: fl, ttl: s.LeaseTTL, log: a.Log}
	if r.ttl <= 0 {
		r.ttl = lease.DefaultTTL
	}
	names := make([]string, 0, len(fl.Machines()))
	for _, m := range fl.Machines() {
		names = append(names, m.Name)
	}
	r.leases = lease.New(lease.Options{Pool: p.Pool(), Replica: replicaID, Machines: names, TTL: s.LeaseTTL, Logger: a.Log,
		OnAcquire: func(machine string, _ int64) { r.adopt(a, machine) }})
	return r
}

// rows is what this replica's watcher holds of a machine now (the detector's catch-up input).
func (r *replication) rows(machine string) []t3rpc.ThreadShell {
	m, err := r.fleet.Machine(machine)
	if err != nil || m.Watcher() == nil {
		return nil
	}
	return m.Watcher().Threads()
}

// claimRemoved takes, for one prune, the lease of a machine no replica detects any more (removed
// from t3code.toml; events.Options.ClaimRemoved). The database's answer is bounded by the lease
// TTL; a failure is logged and leaves the machine to the next prune.
func (r *replication) claimRemoved(machine string) (token int64, release func(), ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), r.ttl)
	defer cancel()
	token, end, ok, err := r.leases.ClaimRemoved(ctx, machine)
	if err != nil {
		r.log.Warn("could not claim a removed machine to prune its left-overs; the next prune tries again", "machine", machine, "err", err)
		return 0, nil, false
	}
	if !ok {
		return 0, nil, false
	}
	return token, func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.ttl)
		defer cancel()
		if err := end(ctx); err != nil {
			r.log.Warn("could not release the claim of a removed machine; it expires by itself", "machine", machine, "err", err)
		}
	}, true
}

// adopt catches the detector up on a machine whose lease this replica just gained, retrying
// (the database may be briefly away) while the lease is still ours: a machine whose stream is
// quiet would otherwise wait for its next chunk to be caught up.
func (r *replication) adopt(a *App, machine string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx := r.ctx
	if ctx == nil || ctx.Err() != nil || a.Detector == nil {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_, err := backoff.Retry(ctx, func() (struct{}, error) {
			if _, held := r.leases.Held(machine); !held {
				return struct{}{}, nil
			}
			return struct{}{}, a.Detector.Adopt(machine)
		}, backoff.WithBackOff(backoff.NewExponentialBackOff()), backoff.WithMaxElapsedTime(0))
		if err != nil && ctx.Err() == nil {
			a.Log.Warn("could not catch up a machine after gaining its lease; its next change retries", "machine", machine, "err", err)
		}
	}()
}

// run holds the leases until ctx ends (then releases them, so the other replicas take over at
// once).
func (r *replication) run(ctx context.Context) {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	r.leases.Run(ctx)
	r.wg.Wait()
}
