package store

import "errors"

// Fence is the lease a detector commit was made under (replicas sharing PostgreSQL,
// internal/lease): the PostgreSQL store writes a fenced Batch only while the machine's lease
// token is still Token (lease.CheckFence, in the commit's own transaction). The bbolt store has
// one process and no leases: it ignores the fence.
type Fence struct {
	Machine string
	Token   int64
}

// ErrFenced: the batch's fence token is no longer the machine's (another replica took the
// lease); nothing of the batch was written.
var ErrFenced = errors.New("machine lease lost: another replica detects this machine's events now")
