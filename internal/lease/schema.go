package lease

import _ "embed"

// Schema creates the lease tables (idempotent). The PostgreSQL store applies it as one of its
// numbered migrations; it is here, beside the queries that use it, so both stay in step.
//
//go:embed schema.sql
var Schema string
