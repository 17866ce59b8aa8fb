package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/stages"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// job is one event handed to a worker: a stream's head to deliver (or to enrich, enrich), or an
// event behind the head to enrich ahead of delivery (ahead).
type job struct {
	s       *stream // the loop's; the worker never touches it
	seq     uint64
	bo, ebo backoff.BackOff
	client  *http.Client // the pool this request's connection comes from
	ticket  uint64       // a delivery's number, in the order the loop started them (adapt)

	enrich bool // complete the head's body (enrichHead)
	ahead  bool // complete the body of an event behind the head and store it (enrichAhead)
	// head is the event's header as the loop holds it; body, when not nil, its body (complete
	// for a delivery, the facts for an enrichment), so that the worker need not read the store;
	// enriched: body came from the Enricher and is not stored yet.
	head     store.Event
	body     []byte
	enriched bool
}

// outcome is what a worker did with a job: the op to record, and what the loop does once it is
// recorded.
type outcome struct {
	job       job
	op        *store.Op   // nil: nothing to record
	event     store.Event // the head's header after the op (for a retry)
	final     bool        // delivered or dead: the stream moves on to its next event
	retryAt   time.Time   // retry (or enrichment retry) at this wall time…
	retryIn   time.Duration
	delivered bool          // the receiver accepted it (2xx)
	lag       time.Duration // a delivered event's time from CreatedAt to its delivery (loop.summarise)
	// outage: a failed attempt that says nothing about this event (no answer, or a 5xx without
	// Retry-After): when the receiver comes back, such retries need not wait for their backoff.
	outage bool
	// overload: the receiver failed in a way that says it is overloaded or down (no answer,
	// 408, 429, 5xx): fewer requests in flight (loop.adapt).
	overload  bool
	cancelled bool   // shutdown interrupted the job
	err       error  // reading the event, or recording the op, failed
	body      []byte // an enrichment's complete body (enrichHead: nil means try again at retryAt)
	failed    bool   // enrichAhead: T3 could not be read; the head's enrichment tries again later
}

// work reads the event with its body, completes it when it needs enrichment, makes one attempt
// and classifies the result. It never writes to the store itself: the recorder does, in batches.
func (o *Outbox) work(ctx context.Context, j job) outcome {
	out := outcome{job: j}
	e, err := o.event(j)
	if err != nil {
		out.err = err
		return out
	}
	var enriched []byte
	if j.enriched {
		enriched, e.Enrich = e.Body, false
	} else if e.Enrich && o.cfg.Enricher != nil {
		// Not completed before it was handed over (the loop completes heads before delivery;
		// this is the safety net): complete it here.
		body, retryAt, err := o.enrich(ctx, e, j.ebo)
		switch {
		case ctx.Err() != nil:
			out.cancelled = true
			return out
		case err != nil: // not yet: the stream waits for the next try, other streams go on
			now := o.cfg.Clock()
			out.event, out.retryAt, out.retryIn = e, retryAt, retryAt.Sub(now)
			out.event.Body = nil
			return out
		}
		enriched, e.Body, e.Enrich = body, body, false
	}

	start := time.Now()
	if e.Attempts == 0 {
		o.m.firstAttempt.Observe(max(0, start.Sub(e.CreatedAt).Seconds()))
	}
	markEvent(markAttempt, e.ID)
	r := o.attempt(ctx, j.client, e)
	markEvent(markAnswered, e.ID)
	stages.ObserveSince(o.m.attempt, start)
	if !r.ok && r.network && ctx.Err() != nil {
		// Shutting down: not the receiver's fault, not an attempt. The enriched body is kept,
		// though: the receiver may have seen it, and a retry must send the same bytes.
		out.cancelled = true
		if enriched != nil {
			out.op = &store.Op{ID: e.ID, Seq: e.Seq, Kind: store.OpBody, Body: enriched}
		}
		return out
	}
	out.op = o.classify(e, r, j.bo, &out)
	out.op.Body = enriched
	return out
}

// event is j's event with its body: as the loop handed it over, else read from the store.
func (o *Outbox) event(j job) (store.Event, error) {
	if j.body == nil {
		return o.q.PendingEvent(j.seq, true)
	}
	e := j.head
	e.Body = j.body
	return e, nil
}

// enrichHead completes a head's body before its first attempt: the body, or when to try again
// (retries with backoff, then the partial body at EnrichTimeout). It writes nothing: the body
// is stored with the first attempt's record.
func (o *Outbox) enrichHead(ctx context.Context, j job) outcome {
	out := outcome{job: j}
	e, err := o.event(j)
	if err != nil {
		out.err = err
		return out
	}
	if !e.Enrich {
		out.body = e.Body // completed meanwhile
		return out
	}
	markEvent(markEnrich, e.ID)
	body, retryAt, err := o.enrich(ctx, e, j.ebo)
	switch {
	case ctx.Err() != nil:
		out.cancelled = true
	case err != nil:
		out.retryAt, out.retryIn = retryAt, retryAt.Sub(o.cfg.Clock())
	default:
		out.body = body
	}
	return out
}

// enrichAhead completes the body of an event behind its stream's head, one try, for the loop to
// hold until the event is the head (then it is stored with the first attempt's record, like a
// head's). A failure is left to the head's enrichment, which retries and gives up in time.
func (o *Outbox) enrichAhead(ctx context.Context, j job) outcome {
	out := outcome{job: j}
	e, err := o.event(j)
	if err != nil {
		out.err = err
		return out
	}
	if !e.Enrich {
		return out // complete already
	}
	ectx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	body, err := o.cfg.Enricher.Enrich(ectx, e)
	cancel()
	if err == nil && !json.Valid(body) {
		err = errors.New("the enricher returned a body that is not JSON")
	}
	switch {
	case ctx.Err() != nil:
		out.cancelled = true
	case err != nil:
		out.failed = true
		o.m.enrichments.WithLabelValues(enrichRetry).Inc()
		o.log.Debug("outbox: completing an event ahead of delivery failed; its turn as the head tries again", "id", e.ID, "stream", e.Stream, "err", err)
	default:
		o.m.enrichments.WithLabelValues(enrichComplete).Inc()
		e.Body, e.Enrich = nil, false
		out.event, out.body = e, body
	}
	return out
}

// classify turns an attempt's result into the op that records it, counts it in the metrics and
// logs it.
func (o *Outbox) classify(e store.Event, r result, bo backoff.BackOff, out *outcome) *store.Op {
	now := o.cfg.Clock()
	attempt := e.Attempts + 1
	switch {
	case r.ok:
		o.m.delivered.Inc()
		o.m.lag.Observe(max(0, now.Sub(e.CreatedAt).Seconds()))
		// One line per delivered event at Debug only: at Info it was a write under the
		// handler's mutex for every event (the loop sums the deliveries up at Info instead,
		// loop.summarise). Enabled first, so that a disabled line costs no attributes.
		if o.log.Enabled(context.Background(), slog.LevelDebug) {
			o.log.Debug("event delivered", "id", e.ID, "stream", e.Stream, "attempt", attempt, "status", r.status, "lag_ms", max(0, now.Sub(e.CreatedAt).Milliseconds()))
		}
		out.final, out.delivered, out.lag = true, true, max(0, now.Sub(e.CreatedAt))
		return &store.Op{ID: e.ID, Seq: e.Seq, Kind: store.OpDelivered, At: now}

	case !r.retryable:
		o.m.deliveries.WithLabelValues(outcomeLabel(r)).Inc()
		o.m.deadLetters.WithLabelValues(reasonRejected).Inc()
		o.log.Error("outbox: rejected by the receiver; dead letter", "id", e.ID, "stream", e.Stream, "attempt", attempt, "err", r.msg)
		out.final = true
		return &store.Op{ID: e.ID, Seq: e.Seq, Kind: store.OpDead, At: now, Error: r.msg}
	}

	o.m.deliveries.WithLabelValues(outcomeLabel(r)).Inc()
	log := o.log.With("id", e.ID, "stream", e.Stream, "attempt", attempt) // failures only: rare
	deadline := e.EnqueuedAt.Add(o.cfg.MaxAge)
	if !now.Before(deadline) {
		o.m.deadLetters.WithLabelValues(reasonExpired).Inc()
		reason := fmt.Sprintf("expired: not delivered within %s (%d attempts); last error: %s", o.cfg.MaxAge, attempt, r.msg)
		log.Error("outbox: giving up; dead letter", "err", reason)
		out.final = true
		return &store.Op{ID: e.ID, Seq: e.Seq, Kind: store.OpDead, At: now, Error: reason}
	}
	delay := r.retryAfter // the receiver's word wins over our backoff
	if delay < 0 {
		delay = bo.NextBackOff()
		if delay == backoff.Stop {
			delay = o.cfg.MaxAge // the policy gave up: the one last try at the deadline
		}
		delay = max(0, delay)
	}
	next := now.Add(delay)
	// One last try at the deadline rather than none: a retry scheduled past it would only find
	// the event expired.
	if next.After(deadline) {
		next = deadline
	}
	cause := causeReceiver
	if r.network {
		cause = causeNetwork
	}
	o.m.retries.WithLabelValues(cause).Inc()
	log.Warn("outbox: delivery failed; will retry", "err", r.msg, "retry_in", next.Sub(now).String())
	out.event = e
	out.event.Body = nil
	out.event.Attempts, out.event.NextAttempt, out.event.LastError = attempt, next, r.msg
	out.retryAt, out.retryIn = next, next.Sub(now)
	out.outage = r.retryAfter < 0 && (r.network || r.status >= 500)
	out.overload = true // every retryable failure: no answer, 408, 429, 5xx
	return &store.Op{ID: e.ID, Seq: e.Seq, Kind: store.OpRetry, Next: next, Error: r.msg}
}

func outcomeLabel(r result) string {
	if r.network {
		return outcomeNetwork
	}
	return outcomeReceiver
}

// enrich asks the Enricher for e's complete body. On failure it returns when to try again, or,
// once EnrichTimeout has passed since the event was queued, the Partial body instead (err nil).
func (o *Outbox) enrich(ctx context.Context, e store.Event, ebo backoff.BackOff) (body []byte, retryAt time.Time, err error) {
	log := o.log.With("id", e.ID, "stream", e.Stream)
	ectx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	body, err = o.cfg.Enricher.Enrich(ectx, e)
	cancel()
	if err == nil && !json.Valid(body) {
		err = errors.New("the enricher returned a body that is not JSON")
	}
	if err == nil {
		o.m.enrichments.WithLabelValues(enrichComplete).Inc()
		return body, time.Time{}, nil
	}
	if ctx.Err() != nil {
		return nil, time.Time{}, ctx.Err()
	}
	now := o.cfg.Clock()
	deadline := e.EnqueuedAt.Add(o.cfg.EnrichTimeout)
	if now.Before(deadline) {
		d := ebo.NextBackOff()
		if d == backoff.Stop {
			d = deadline.Sub(now)
		}
		next := now.Add(max(0, d))
		if next.After(deadline) {
			next = deadline // the partial body is sent at the deadline, not after the next delay
		}
		o.m.enrichments.WithLabelValues(enrichRetry).Inc()
		log.Warn("outbox: completing the event failed; will retry", "err", err, "retry_in", next.Sub(now).String())
		return nil, next, err
	}
	body = o.cfg.Enricher.Partial(e, err)
	if !json.Valid(body) {
		body = e.Body // the committed facts are valid JSON at least
	}
	o.m.enrichments.WithLabelValues(enrichPartial).Inc()
	log.Error("outbox: could not complete the event in time; delivering it partial", "err", err, "enrich_timeout", o.cfg.EnrichTimeout.String())
	return body, time.Time{}, nil
}
