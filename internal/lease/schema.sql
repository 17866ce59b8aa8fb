-- Machine leases and replica heartbeats (internal/lease). Times are the database's (now()), the
-- one clock every replica shares.
CREATE TABLE IF NOT EXISTS t3_machine_leases (
    machine    text PRIMARY KEY,
    holder     text NOT NULL DEFAULT '',
    token      bigint NOT NULL DEFAULT 0,          -- fencing token: +1 at every acquisition
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE TABLE IF NOT EXISTS t3_replicas (
    id         text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
