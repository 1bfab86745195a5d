-- Workflows; the same change as migrations/sqlite/0008_workflows.sql. A shard keeps a workflow
-- as a job (`kind` 'workflow') whose spec holds the steps; each run is an occurrence of it and
-- each step one of the occurrence's tickets (its item). A step that waits for others is written
-- `waiting`, with no attempt, when the run starts, and is dispatched once the steps it waits for
-- have succeeded, or recorded `skipped` with the reason.
ALTER TABLE jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'job';
ALTER TABLE tickets ADD COLUMN reason TEXT;
-- Runs with steps still waiting: what a shard advances again when it opens.
CREATE INDEX tickets_waiting ON tickets (job_id, scheduled_at) WHERE status = 'waiting';
