-- The connector's state (internal/store.Store) on PostgreSQL. Every table is prefixed t3_.

-- Tracked threads: the store.Thread JSON encoding, as the bbolt backend keeps it.
CREATE TABLE t3_threads (
    id      text PRIMARY KEY,
    machine text NOT NULL,
    data    jsonb NOT NULL
);

-- The event detector's opaque per-thread state. COLLATE "C": byte order, as bbolt's.
CREATE TABLE t3_detector (
    key   text COLLATE "C" PRIMARY KEY,
    value bytea NOT NULL
);

-- The outbox. seq orders events: drawn from t3_events_seq while the inserting transaction holds
-- the event-insert advisory lock, so sequence numbers are assigned in commit order.
CREATE SEQUENCE t3_events_seq;

CREATE TABLE t3_events (
    seq          bigint PRIMARY KEY,
    id           text NOT NULL UNIQUE,
    stream       text COLLATE "C" NOT NULL,
    state        text NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    body         bytea NOT NULL,          -- the webhook body, byte for byte
    enrich       boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL,
    enqueued_at  timestamptz NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    next_attempt timestamptz,
    last_error   text NOT NULL DEFAULT '',
    delivered_at timestamptz,
    dead_at      timestamptz,
    -- A delivery claim (several replicas deliver from one table): who holds it, until when.
    claimed_by   text,
    claim_until  timestamptz
);

-- Pending events by stream: the heads, and a stream's FIFO.
CREATE INDEX t3_events_pending ON t3_events (stream, seq) WHERE state = 'pending';
CREATE INDEX t3_events_dead ON t3_events (seq) WHERE state = 'dead';
CREATE INDEX t3_events_delivered ON t3_events (delivered_at) WHERE state = 'delivered';

-- Event counts by state, kept by every transaction that changes them (Counts is O(1)).
CREATE TABLE t3_event_counts (
    state text PRIMARY KEY,
    n     bigint NOT NULL
);
INSERT INTO t3_event_counts VALUES ('pending', 0), ('delivered', 0), ('dead', 0);

-- t3_dispatch idempotency keys.
CREATE TABLE t3_idempotency (
    key        text PRIMARY KEY,
    record     bytea NOT NULL,          -- the JSON record, byte for byte
    created_at timestamptz NOT NULL
);
CREATE INDEX t3_idempotency_created ON t3_idempotency (created_at);
