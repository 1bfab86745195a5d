-- Retries, the timeout watchdog, dead letters, overlap buffering and tenant pauses.

-- A retry attempt is written when the attempt before it fails, and published once `not_before`
-- has passed (NULL: at once).
ALTER TABLE attempts ADD COLUMN not_before INTEGER;
-- The last progress report of a running attempt: the watchdog waits while it is recent.
ALTER TABLE attempts ADD COLUMN heartbeat_at INTEGER;
-- Attempts not finished (waiting for their backoff, published, running): what a shard re-arms
-- its retry and watchdog timers from when it opens.
CREATE INDEX attempts_open ON attempts (ticket_id, attempt) WHERE finished_at IS NULL;

-- The per-attempt timeout of the ticket (the job's `timeout` when it fired).
ALTER TABLE tickets ADD COLUMN timeout_ms INTEGER;
-- Attempts numbered up to `attempt_base` belong to earlier replays: a replayed dead ticket gets
-- the job's `max_attempts` again.
ALTER TABLE tickets ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;
-- Set while the ticket is a dead letter (its attempts are exhausted); cleared by a replay.
ALTER TABLE tickets ADD COLUMN dead_at INTEGER;
CREATE INDEX tickets_dead ON tickets (dead_at, id) WHERE dead_at IS NOT NULL;

-- Runs that still have work going on, for the overlap policies.
CREATE INDEX runs_active ON runs (job_id) WHERE status IN ('dispatched', 'running', 'retrying');

-- overlap = buffer_one: the one occurrence waiting for the job's active run to end.
ALTER TABLE jobs ADD COLUMN buffered_at INTEGER;

-- Tenants whose jobs do not fire; a job keeps its own state while its tenant is paused.
CREATE TABLE paused_tenants (
    tenant    TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL
);

-- The job's priority (also in `spec`), so the loader can order a storm without parsing specs.
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 5;
UPDATE jobs SET priority = COALESCE(json_extract(spec, '$.priority'), 5);
