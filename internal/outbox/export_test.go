package outbox

// LoopTurns is the number of turns o's loop has taken, for the benchmarks of package
// outbox_test (the goroutine hand-offs per delivery).
func LoopTurns(o *Outbox) int64 { return o.turns.Load() }
