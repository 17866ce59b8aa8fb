package outbox

// LoopTurns is the number of turns o's loop has taken, for the benchmarks of package
// outbox_test (the goroutine hand-offs per delivery).
func LoopTurns(o *Outbox) int64 { return o.turns.Load() }

// HandStarts is the number of deliveries o started from the group commit's hand-over without a
// turn of its loop (startHanded), for the benchmarks of package outbox_test.
func HandStarts(o *Outbox) int64 { return o.handStarts.Load() }
