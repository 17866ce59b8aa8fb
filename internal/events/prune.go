package events

import (
	"sort"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Prune bounds the state: tracked threads nobody watches are forgotten once
// their record is older than the retention (T3CODE_MCP_THREAD_RETENTION), and
// detector state left without a watched thread (a dispatch that failed, a
// thread watched on another machine since) is dropped. Watched threads keep
// their record and their seen state, which holds only ids and flags. It
// returns how many thread records were deleted.
func (d *Detector) Prune() (int, error) {
	threads, err := d.tracked.ListThreads()
	if err != nil {
		return 0, err
	}
	cutoff := d.now().Add(-d.retention)
	watched := map[string]bool{}
	var gone []string
	for _, t := range threads {
		if t.Watch {
			watched[key(t.Machine, t.ID)] = true
			continue
		}
		last := t.UpdatedAt
		if last.IsZero() {
			last = t.CreatedAt
		}
		if last.Before(cutoff) {
			gone = append(gone, t.ID)
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
	// Serialise with the machines: a thread watched again meanwhile keeps its
	// state (checked again under the locks).
	d.mu.Lock()
	machines := make([]string, 0, len(d.locks))
	for m := range d.locks {
		machines = append(machines, m)
	}
	d.mu.Unlock()
	sort.Strings(machines)
	for _, m := range machines {
		mu := d.machineLock(m)
		mu.Lock()
		defer mu.Unlock()
	}
	for k := range orphans {
		m, id, _ := splitKey(k)
		if t, ok, err := d.tracked.GetThread(id); err == nil && ok && t.Watch && t.Machine == m {
			delete(orphans, k)
		}
	}
	kept := gone[:0]
	for _, id := range gone {
		if t, ok, err := d.tracked.GetThread(id); err == nil && ok && !t.Watch && !t.UpdatedAt.After(cutoff) {
			kept = append(kept, id)
		}
	}
	gone = kept
	if err := d.store.Commit(store.Batch{Detector: orphans, DeleteThreads: gone}); err != nil {
		return 0, err
	}
	d.mu.Lock()
	for k := range orphans {
		delete(d.cache, k)
	}
	d.mu.Unlock()
	for k := range orphans {
		d.lookups.drop(k)
	}
	if len(gone) > 0 || len(orphans) > 0 {
		d.log.Info("pruned tracked threads", "threads", len(gone), "detector_states", len(orphans))
	}
	return len(gone), nil
}
