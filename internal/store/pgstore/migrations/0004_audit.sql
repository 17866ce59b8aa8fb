-- The audit log of replicas sharing the database (internal/audit.Shared): one row per mutating
-- tool call, whichever replica served it. line is the record's JSON line byte for byte, as the
-- file log holds it; the other columns are copies of its fields for filtering.
CREATE TABLE t3_audit (
    seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    tool    text NOT NULL,
    machine text NOT NULL DEFAULT '',
    thread  text NOT NULL DEFAULT '',
    replica text NOT NULL DEFAULT '',
    line    bytea NOT NULL,
    -- SHA-256 of line: a record stored twice (a retried insert, migrate-store run again) is kept once.
    digest  bytea NOT NULL UNIQUE
);
CREATE INDEX t3_audit_at ON t3_audit (at);
CREATE INDEX t3_audit_machine ON t3_audit (machine, at);
CREATE INDEX t3_audit_thread ON t3_audit (thread, at);
