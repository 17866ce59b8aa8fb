package store

import "time"

// One op in its own transaction, as the outbox records a single outcome: the tests' shorthand
// for Record (the outbox itself always records through Record).

func (s *Bolt) record(op Op) error {
	errs, err := s.Record([]Op{op})
	if err != nil {
		return err
	}
	return errs[0]
}

// MarkDelivered records a successful attempt at time at (Record with one OpDelivered).
func (s *Bolt) MarkDelivered(id string, at time.Time) error {
	return s.record(Op{ID: id, Kind: OpDelivered, At: at})
}

// MarkDead records a final failed attempt (or an expiry) at time at (Record with one OpDead).
func (s *Bolt) MarkDead(id string, at time.Time, reason string) error {
	return s.record(Op{ID: id, Kind: OpDead, At: at, Error: reason})
}

// MarkRetry records a failed attempt: the event stays its stream's head until next (Record with
// one OpRetry).
func (s *Bolt) MarkRetry(id string, next time.Time, errMsg string) error {
	return s.record(Op{ID: id, Kind: OpRetry, Next: next, Error: errMsg})
}
