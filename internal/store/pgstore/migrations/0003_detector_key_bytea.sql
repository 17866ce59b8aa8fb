-- Detector keys are machine + NUL + thread (internal/events): bytes, not text (PostgreSQL text
-- holds no NUL). bytea sorts by bytes, as bbolt does.
ALTER TABLE t3_detector ALTER COLUMN key TYPE bytea USING convert_to(key, 'UTF8');
