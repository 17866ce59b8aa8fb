package audit

import (
	"context"
	"log/slog"
	"time"
)

// Pruner is a Table that forgets old records (internal/store/pgstore's t3_audit).
type Pruner interface {
	// PruneAudit deletes the records written before before and returns how many.
	PruneAudit(ctx context.Context, before time.Time) (int, error)
}

// DefaultPruneEvery is how often KeepFor prunes when no interval is given.
const DefaultPruneEvery = time.Hour

// KeepFor bounds the shared table (T3CODE_MCP_AUDIT_RETENTION): it deletes the records older than
// retention at once, then every every (default DefaultPruneEvery), until ctx ends. Every replica
// runs it: deleting the rows before a cutoff is idempotent, so replicas pruning at once only
// repeat each other's work, and the table is pruned while any replica runs. A failed prune is
// logged and tried again at the next tick. (The file log is bounded by rotation instead.)
func KeepFor(ctx context.Context, t Pruner, retention, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		every = DefaultPruneEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		n, err := t.PruneAudit(pctx, time.Now().Add(-retention))
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("could not prune the audit table; the next prune tries again", "err", err)
		case n > 0:
			log.Info("pruned the audit table", "records", n, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
