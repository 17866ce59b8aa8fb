package loadtest

import (
	"testing"
	"time"
)

// startsPerTick steps n machines' pipelines at total runs per second through two periods of
// driver ticks, as setPipeline sets them up and machine.tick starts their runs, and returns the
// most runs started in one tick and the runs started in all.
func startsPerTick(n int, total float64, lockStep bool) (most, all int) {
	per := total / float64(n)
	t0 := time.Unix(1_700_000_000, 0)
	ps := make([]pipeline, n)
	for i := range ps {
		ps[i] = pipeline{rate: per, start: t0.Add(-pipelinePhase(i, n, per, lockStep))}
	}
	period := time.Duration(float64(time.Second) / per)
	for now := t0; now.Before(t0.Add(2 * period)); now = now.Add(tick) {
		inTick := 0
		for i := range ps {
			if d := ps[i].due(now); d > 0 {
				ps[i].started += d
				inTick += d
			}
		}
		most, all = max(most, inTick), all+inTick
	}
	return most, all
}

// The machines' runs arrive spread over the period at the total rate, not all machines' at once:
// at 1,000/s on 100 machines about 5 per 5-ms tick, at 20/s on 100 machines 1 per tick at most
// (lock-step: 100 in one tick every 100 ms, or every 5 s). -lockstep keeps the old way.
func TestPipelinesSpreadTheMachinesRuns(t *testing.T) {
	for _, c := range []struct {
		n     int
		total float64
	}{{100, 1000}, {100, 20}, {4, 200}, {100, 5000}} {
		most, all := startsPerTick(c.n, c.total, false)
		perTick := int(c.total*tick.Seconds()) + 1
		if most > perTick+1 {
			t.Errorf("%d machines at %.0f/s: %d runs started in one tick, want at most %d (spread)", c.n, c.total, most, perTick+1)
		}
		if want := 2 * c.n; all < want-c.n || all > want+c.n {
			t.Errorf("%d machines at %.0f/s: %d runs started over two periods, want about %d (the rate kept)", c.n, c.total, all, want)
		}
		if most, _ := startsPerTick(c.n, c.total, true); most != c.n {
			t.Errorf("%d machines at %.0f/s, lock-step: %d runs at most in one tick, want %d (every machine at once)", c.n, c.total, most, c.n)
		}
	}
	if d := pipelinePhase(3, 100, 0, false); d != 0 {
		t.Errorf("phase at rate 0: %v, want 0", d)
	}
}
