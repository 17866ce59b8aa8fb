package fleet

import (
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// A t3_wait woken by its thread's own subscription (internal/wait, ByFeed) returns a moment
// before the machine's watcher has the row that shows the same thing: T3 sends the shell
// stream's next chunk only after the connector acknowledged the one before, once it was
// durable. A tool the client calls right after finds the thread by that row — t3_answer on
// the question the wait just returned, t3_interrupt, a steer — and would act on the older
// row ("no pending question"). ExpectRow notes what the wait saw; the next lookups of the
// thread give the row up to rowCatchUpGrace to show it, then answer from whatever row there
// is.

// rowCatchUpGrace bounds how long a lookup waits for an expected row: the commit in flight
// under load is tens of milliseconds; a machine whose shell stream stalls longer answers from
// the row it has.
const rowCatchUpGrace = 3 * time.Second

// maxRowExpectations bounds the notes kept per machine (each is dropped once its row came, or
// its grace ended, at the thread's next lookup; the rest are swept when this many are kept).
const maxRowExpectations = 1024

type rowExpectation struct {
	caughtUp func(*t3rpc.ThreadShell) bool
	until    time.Time
}

// ExpectRow notes that the thread's own subscription showed what caughtUp tests for (a wait
// woken by it): until the watcher's row passes caughtUp, or rowCatchUpGrace has passed, a
// lookup of the thread waits for it.
func (m *Machine) ExpectRow(threadID string, caughtUp func(*t3rpc.ThreadShell) bool) {
	if m == nil || m.watcher == nil || caughtUp == nil {
		return
	}
	now := time.Now()
	m.expectMu.Lock()
	defer m.expectMu.Unlock()
	if m.expect == nil {
		m.expect = map[string]rowExpectation{}
	}
	if len(m.expect) >= maxRowExpectations {
		for id, e := range m.expect {
			if now.After(e.until) {
				delete(m.expect, id)
			}
		}
	}
	if len(m.expect) < maxRowExpectations {
		m.expect[threadID] = rowExpectation{caughtUp, now.Add(rowCatchUpGrace)}
	}
}

// RowCatchUps counts the lookups that waited for an expected row (ExpectRow).
func (m *Machine) RowCatchUps() int64 { return m.rowCatchUps.Load() }

// catchUp returns the thread's row once it shows what a wait's subscription showed (ExpectRow),
// waiting for it within the note's grace; the row given when nothing is expected or the grace
// ran out.
func (m *Machine) catchUp(id string, shell t3rpc.ThreadShell, seq int64) (t3rpc.ThreadShell, int64) {
	m.expectMu.Lock()
	e, ok := m.expect[id]
	m.expectMu.Unlock()
	if !ok {
		return shell, seq
	}
	if !e.caughtUp(&shell) && time.Now().Before(e.until) {
		m.rowCatchUps.Add(1)
		timer := time.NewTimer(time.Until(e.until))
		defer timer.Stop()
	wait:
		for {
			row, found, changed := m.watcher.ThreadAndWait(id)
			if found && e.caughtUp(&row) {
				break
			}
			select {
			case <-changed:
			case <-timer.C:
				break wait
			}
		}
		if row, s, found := m.watcher.ThreadAt(id); found {
			shell, seq = row, s
		}
	}
	m.expectMu.Lock()
	if cur, ok := m.expect[id]; ok && cur.until == e.until {
		delete(m.expect, id) // caught up or given up: later lookups take the row as it is
	}
	m.expectMu.Unlock()
	return shell, seq
}
