package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// This file: the setup phase: the fake machines, the store, and the connector (in process, a
// built binary, or several replicas).

func (h *harness) setup(ctx context.Context) error {
	cfg := h.cfg
	h.dir = cfg.WorkDir
	if h.dir == "" {
		d, err := os.MkdirTemp("", "t3code-load-")
		if err != nil {
			return err
		}
		h.dir = d
	} else if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	h.state = filepath.Join(h.dir, "state")
	if err := os.RemoveAll(h.state); err != nil {
		return err
	}
	var err error
	if len(cfg.Split) > 0 {
		if h.clients, err = startClients(cfg.Split); err != nil {
			return err
		}
		h.rec = h.clients.rec
	} else if h.rec, err = newReceiver(); err != nil {
		return err
	}
	token := "t3load-" + fmt.Sprint(rand.Uint64())
	opts := t3fake.Options{Token: token, KeepRuns: cfg.KeepRuns}
	for i := 0; i < cfg.Machines; i++ {
		m, err := newMachine(i, fmt.Sprintf("load-%03d", i), opts, cfg.Compression)
		if err != nil {
			return err
		}
		h.machines = append(h.machines, m)
	}
	h.all = append(h.all, h.machines...)
	if cfg.BigThreadItems > 0 && cfg.runs("thread") {
		bo := opts
		bo.KeepRuns = -1
		bo.ControlPlane = cfg.ThreadControlPlane
		if h.big, err = newMachine(cfg.Machines, "big", bo, cfg.Compression); err != nil {
			return err
		}
		h.all = append(h.all, h.big)
	}

	h.logf("seeding %d machines × %d threads, %d finished runs each", cfg.Machines, cfg.Threads, cfg.SeedRuns)
	t0 := time.Now()
	sem := make(chan struct{}, 4)
	errs := make(chan error, len(h.all))
	var wg sync.WaitGroup
	for _, m := range h.all {
		n := cfg.Threads
		if m == h.big {
			n = 1 + cfg.ThreadFirst
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := m.seed(ctx, n); err != nil {
				errs <- err
				return
			}
			if m != h.big {
				if err := m.finishRuns(cfg.SeedRuns); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if h.big != nil {
		for _, tid := range h.big.threads {
			if err := h.big.bigThread(tid, (cfg.BigThreadItems+4)/5); err != nil {
				return err
			}
		}
	}
	h.rep.Startup.SeedTime = time.Since(t0)
	// The harness's own command sockets (run.interrupt releases the waits' and the comparison's
	// runs), dialed now, before any window: dialed at a phase's first releases, one ticket POST
	// and one WebSocket upgrade per machine fell into the phase's window, in the harness's CPU
	// and, for a comparison run alone, in the fakes' request counts it attributes to the
	// connector.
	for _, m := range h.machines {
		if _, err := m.rpc(ctx); err != nil {
			return fmt.Errorf("%s: command socket: %w", m.name, err)
		}
	}
	h.rep.Startup.Threads = cfg.Machines * cfg.Threads
	if h.big != nil {
		h.rep.Startup.Threads += len(h.big.threads)
	}
	h.logf("seeded in %.1f s", h.rep.Startup.SeedTime.Seconds())

	// Roles: threads interleaved across machines, so every role spreads over all of them.
	var slots []slot
	for j := 0; j < cfg.Threads; j++ {
		for _, m := range h.machines {
			slots = append(slots, slot{m, m.threads[j]})
		}
	}
	take := func(n int) []slot {
		out := slots[:n:n]
		slots = slots[n:]
		return out
	}
	h.roles.waits = take(cfg.Waits)
	h.roles.push = take(cfg.PushRuns)
	unwatched := map[string]bool{}
	for _, p := range cfg.Pollers {
		ss := take(p.Runs)
		for _, s := range ss {
			unwatched[s.thread] = true
		}
		h.roles.polls = append(h.roles.polls, ss)
	}
	for _, s := range slots {
		s.m.pipe.threads = append(s.m.pipe.threads, s.thread)
	}

	// Every thread but the pollers' (and the big one) is tracked and watched, as if an agent had
	// dispatched or adopted it earlier: written into the state file before the connector starts.
	st, err := h.openStore(ctx)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	var tracked []store.Thread
	for _, m := range h.machines {
		for _, tid := range m.threads {
			if unwatched[tid] {
				continue
			}
			tracked = append(tracked, store.Thread{ID: tid, Machine: m.name, ProjectID: m.pid, ProjectTitle: "load",
				Title: "Load thread", Origin: "t3code-load", Watch: true, CreatedAt: now, UpdatedAt: now})
		}
	}
	t1 := time.Now()
	err = writeTracked(st, tracked)
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	h.logf("wrote %d tracked threads into the state in %.1f s", len(tracked), time.Since(t1).Seconds())
	h.rep.Startup.Watched = len(tracked)
	return err
}

// writeTracked commits the tracked threads in one batch, in key order. Thread ids are random
// (thread-<uuid>), and bbolt puts each key into its leaf page by a search and an insert that
// moves the keys after it: 100,000 ids in random order made every insert move half a growing
// page of keys, 6.4 s at start (BenchmarkWriteTracked); in order, each is appended.
func writeTracked(st store.Store, tracked []store.Thread) error {
	slices.SortFunc(tracked, func(a, b store.Thread) int { return strings.Compare(a.ID, b.ID) })
	return st.Commit(store.Batch{Threads: tracked})
}

// openStore opens the connector's store while no connector runs: the bbolt file, or the
// PostgreSQL database (-database-url).
func (h *harness) openStore(ctx context.Context) (store.Store, error) {
	if h.cfg.DatabaseURL != "" {
		return pgstore.Open(ctx, h.cfg.DatabaseURL)
	}
	return store.Open(h.state)
}

// startReplicas starts replicas 2…N beside the first connector, each in a directory of its own,
// and waits until they serve.
func (h *harness) startReplicas(ctx context.Context, env []string) error {
	for i := 2; i <= h.cfg.Replicas; i++ {
		dir := filepath.Join(h.dir, fmt.Sprintf("replica%d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		// Its own state directory, unless the caller's environment names one.
		renv := append([]string{"T3CODE_MCP_STATE_DIR=" + filepath.Join(dir, "state")}, env...)
		renv = slices.DeleteFunc(renv, func(kv string) bool { return kv == "T3CODE_MCP_STATE_DIR="+h.state })
		c, err := startConnector(h.cfg.Binary, dir, renv)
		if err != nil {
			return err
		}
		h.extra = append(h.extra, c)
		if err := c.waitReady(ctx, len(h.all)); err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
	}
	if len(h.extra) > 0 {
		h.logf("%d more replicas serving on the same database", len(h.extra))
	}
	return nil
}

func (h *harness) startConnector(ctx context.Context) error {
	cfgPath := filepath.Join(h.dir, "t3code.toml")
	if err := writeConfig(cfgPath, h.all, h.cfg.Compression); err != nil {
		return err
	}
	env := []string{
		"T3CODE_MCP_CONFIG=" + cfgPath,
		"T3CODE_MCP_STATE_DIR=" + h.state,
		"T3CODE_MCP_LOG_LEVEL=" + h.cfg.LogLevel,
		fmt.Sprintf("T3CODE_MCP_MAX_WAITS=%d", max(2000, h.cfg.Waits+h.cfg.PushRuns+100)),
		TokenEnv + "=" + h.machines[0].token,
	}
	env = append(env, h.cfg.soakEnv()...)
	if !h.cfg.NoHook {
		env = append(env, "T3CODE_MCP_HOOK_URL="+h.rec.url, "T3CODE_MCP_HOOK_SECRET="+hookSecret)
	}
	if h.cfg.DatabaseURL != "" {
		env = append(env, "T3CODE_MCP_DATABASE_URL="+h.cfg.DatabaseURL)
	}
	env = append(env, h.cfg.ReplicaEnv...) // last: the caller's values win
	t0 := time.Now()
	var err error
	if h.cfg.InProcess {
		h.logf("starting the connector in-process with %d machines", len(h.all))
		h.conn, err = startInProcess(h.dir, env)
	} else {
		h.logf("starting %s serve with %d machines", h.cfg.Binary, len(h.all))
		h.conn, err = startConnector(h.cfg.Binary, h.dir, env)
	}
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := h.conn.waitReady(rctx, len(h.all)); err != nil {
		return err
	}
	if err := h.startReplicas(rctx, env); err != nil {
		return err
	}
	h.rep.Startup.Ready = time.Since(t0)
	// Synced: every machine's snapshot chunk was acknowledged, which the connector does once it
	// has applied it and the detector has recorded every watched thread's baseline.
	for _, m := range h.all {
		for m.fk.Stats().AcksReceived < 1 {
			if err := sleepCtx(rctx, time.Millisecond); err != nil {
				return fmt.Errorf("%s: snapshot never acknowledged: %w", m.name, err)
			}
		}
	}
	h.rep.Startup.Synced = time.Since(t0)
	h.logf("ready after %s, synced after %s", ms(h.rep.Startup.Ready), ms(h.rep.Startup.Synced))
	// Idle: 2 s after the last snapshot was acknowledged (the connector returns start-up garbage
	// to the OS once its snapshot gate has been quiet for 0.5 s; internal/watch/gate.go).
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	st, err := h.conn.status()
	if err != nil {
		return err
	}
	su := &h.rep.Startup
	su.IdleRSS, su.RssAnonKB, su.RssFileKB = st["VmRSS"], st["RssAnon"], st["RssFile"]
	if !h.cfg.InProcess {
		if m, err := h.conn.metrics(ctx); err == nil {
			su.HeapInuseKB = int64(m["go_memstats_heap_inuse_bytes"]) / 1024
			su.HeapRetainKB = int64(m["go_memstats_heap_idle_bytes"]-m["go_memstats_heap_released_bytes"]) / 1024
			su.NextGCKB = int64(m["go_memstats_next_gc_bytes"]) / 1024
		}
	}
	if fi, err := os.Stat(filepath.Join(h.state, store.FileName)); err == nil {
		su.StateFileKB = fi.Size() / 1024
	}
	h.logf("idle RSS %s", mb(su.IdleRSS))
	if h.cfg.AfterStartup != nil {
		h.cfg.AfterStartup()
	}
	return err
}
