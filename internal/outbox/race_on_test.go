//go:build race

package outbox

// raceEnabled: the race detector slows every request about tenfold; the largest tests shrink.
const raceEnabled = true
