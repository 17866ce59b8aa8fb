package events

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Prune bounds the state: tracked threads nobody watches are forgotten once
// their record is older than the retention (T3CODE_MCP_THREAD_RETENTION), and
// detector state left without a watched thread (a dispatch that failed, a
// thread watched on another machine since) is dropped. Watched threads keep
// their record and their seen state, which holds only ids and flags. It
// returns how many thread records it pruned (with replicas, a record another
// replica's Track rewrote meanwhile is counted but kept: see commitPrune).
//
// The candidates are found without locks, then decided again on a fresh read
// under the tracking lock (no Track on any machine meanwhile, even one whose
// machine lock does not exist yet) and the locks of the machines involved (no
// chunk or look-up of theirs meanwhile). When that read fails nothing is
// deleted: the next prune tries again.
//
// Replica mode (Options.Lease): a replica prunes only the machines whose lease it holds, each in
// a batch fenced with the lease's token, so a replica that lost a machine's lease never deletes
// the state its new holder detects with; the other machines are left to their holders, except a
// machine no replica detects any more (removed from t3code.toml), which any replica may claim
// for its prune (Options.ClaimRemoved). (The
// outbox's delivered events are pruned by any replica: store.Prune deletes only events already
// delivered, which no replica reads again.)
func (d *Detector) Prune() (int, error) {
	threads, err := d.tracked.ListThreads()
	if err != nil {
		return 0, err
	}
	cutoff := d.now().Add(-d.retention)
	watched := map[string]bool{}
	var gone []string
	machines := map[string]bool{}
	for _, t := range threads {
		if t.Watch {
			watched[key(t.Machine, t.ID)] = true
			continue
		}
		if expired(t, cutoff) {
			gone = append(gone, t.ID)
			machines[t.Machine] = true
		}
	}
	orphans := map[string][]byte{}
	if err := d.store.ForEachDetector(func(k string, _ []byte) error {
		if !watched[k] {
			orphans[k] = nil
		}
		return nil
	}); err != nil {
		return 0, err
	}
	if len(gone) == 0 && len(orphans) == 0 {
		return 0, nil
	}
	if d.hooks.pruneListed != nil {
		d.hooks.pruneListed()
	}
	// Lock order: the tracking lock, then machine locks in name order (Track
	// takes the tracking lock before its machine's).
	d.tracking.Lock()
	defer d.tracking.Unlock()
	ids := append([]string(nil), gone...)
	for k := range orphans {
		m, id, _ := splitKey(k)
		machines[m] = true
		ids = append(ids, id)
	}
	names := make([]string, 0, len(machines))
	for m := range machines {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		mu := d.machineLock(m)
		mu.Lock()
		defer mu.Unlock()
	}
	fresh, err := d.tracked.GetThreads(ids)
	if err != nil {
		return 0, fmt.Errorf("prune: re-read the tracked threads (nothing pruned): %w", err)
	}
	for k := range orphans {
		m, id, _ := splitKey(k)
		if t, ok := fresh[id]; ok && t.Watch && t.Machine == m {
			delete(orphans, k)
		}
	}
	kept := gone[:0]
	for _, id := range gone {
		// A thread moved to a machine not locked here is left for the next prune.
		if t, ok := fresh[id]; ok && !t.Watch && machines[t.Machine] && expired(t, cutoff) {
			kept = append(kept, id)
		}
	}
	gone = kept
	if d.hooks.pruneLocked != nil {
		d.hooks.pruneLocked()
	}
	if len(gone) == 0 && len(orphans) == 0 {
		return 0, nil
	}
	if gone, orphans, err = d.commitPrune(names, gone, orphans, fresh); err != nil {
		return 0, err
	}
	for k := range orphans { // under their machines' locks, taken above
		d.cache.delete(k)
	}
	for k := range orphans {
		d.lookups.drop(k)
	}
	d.log.Info("pruned tracked threads", "threads", len(gone), "detector_states", len(orphans))
	return len(gone), nil
}

// commitPrune deletes what Prune decided and returns what it asked to delete: in one batch with
// one process; in replica mode one batch per machine whose lease this replica holds, fenced with
// its token (a lease lost meanwhile fails its batch alone, which is then left to the new holder).
// Every deletion is conditional in the commit's own transaction (store.Batch.PruneThreads,
// PruneStates): a thread only while its row is still the unwatched one judged here, a state only
// while no row watches its thread on its machine. This process's Track waits for the locks Prune
// holds, but another replica's Track does not: committed between the judgement and this commit,
// its row and baseline are kept.
func (d *Detector) commitPrune(machines, gone []string, orphans map[string][]byte, fresh map[string]store.Thread) ([]string, map[string][]byte, error) {
	batch := func(m string) store.Batch {
		b := store.Batch{PruneThreads: map[string]time.Time{}, PruneStates: map[string]store.StateOwner{}}
		for _, id := range gone {
			if t := fresh[id]; m == "" || t.Machine == m {
				b.PruneThreads[id] = t.UpdatedAt
			}
		}
		for k := range orphans {
			if km, id, _ := splitKey(k); m == "" || km == m {
				b.PruneStates[k] = store.StateOwner{Machine: km, Thread: id}
			}
		}
		return b
	}
	done := func(b store.Batch, gone []string, orphans map[string][]byte) ([]string, map[string][]byte) {
		for id := range b.PruneThreads {
			gone = append(gone, id)
		}
		for k := range b.PruneStates {
			orphans[k] = nil
		}
		return gone, orphans
	}
	if d.lease == nil {
		b := batch("")
		if err := d.store.Commit(b); err != nil {
			return nil, nil, err
		}
		g, o := done(b, nil, map[string][]byte{})
		return g, o, nil
	}
	var doneGone []string
	doneOrphans := map[string][]byte{}
	for _, m := range machines {
		b := batch(m)
		if len(b.PruneThreads) == 0 && len(b.PruneStates) == 0 {
			continue
		}
		token, release, held := d.fenceForPrune(m)
		if !held {
			continue
		}
		b.Fence = &store.Fence{Machine: m, Token: token}
		err := d.store.Commit(b)
		release()
		if err != nil {
			if errors.Is(err, store.ErrFenced) {
				continue // the new holder prunes it
			}
			return doneGone, doneOrphans, err
		}
		doneGone, doneOrphans = done(b, doneGone, doneOrphans)
	}
	return doneGone, doneOrphans, nil
}

// fenceForPrune is the lease a replica prunes machine m under: its own while it holds m, else a
// claim of m when no replica detects it any more (Options.ClaimRemoved); held is false when
// another replica's prune is the one to do it. release ends a claim (a no-op for a held lease).
func (d *Detector) fenceForPrune(m string) (token int64, release func(), held bool) {
	if token, held = d.lease(m); held {
		return token, func() {}, true
	}
	if d.claim == nil {
		return 0, nil, false
	}
	return d.claim(m)
}

// expired says whether an unwatched thread's record is past the retention:
// its last update (its creation when it was never updated) is before cutoff.
// Both of Prune's passes decide with it.
func expired(t store.Thread, cutoff time.Time) bool {
	last := t.UpdatedAt
	if last.IsZero() {
		last = t.CreatedAt
	}
	return last.Before(cutoff)
}
