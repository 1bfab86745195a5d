-- time_window growth: a job whose next occurrence falls in a window that a newer layout places on
-- another shard is handed to that shard. The source deletes the job's row and keeps it here, in
-- the same transaction, until the target confirms it holds the job (`acked`); a node that takes
-- the shard over sends what is not confirmed again. The job's runs, tickets and attempts stay
-- where they happened. An acknowledged row tells a stale copy of the job (sent again after it
-- moved on) from the job coming back: a job's row counts its hand-offs (`jobs.moves`), and each
-- hand-off is numbered by it (`seq`).
CREATE TABLE handoffs (
    job_id          TEXT    PRIMARY KEY,
    target          INTEGER NOT NULL,
    seq             INTEGER NOT NULL,      -- the job's hand-offs so far, this one included
    tenant          TEXT    NOT NULL,
    idempotency_key TEXT,
    body            TEXT    NOT NULL,      -- the job's rows as move pages (JSON)
    acked           INTEGER NOT NULL,      -- 0 until the target holds the job
    created_at      INTEGER NOT NULL
);
CREATE INDEX handoffs_unacked ON handoffs (created_at) WHERE acked = 0;
-- A keyed create asks whether the job of its key left (acknowledged rows included).
CREATE INDEX handoffs_key ON handoffs (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;
ALTER TABLE jobs ADD COLUMN moves INTEGER NOT NULL DEFAULT 0;
