-- One shard's database: its jobs, their occurrences (runs), tickets and attempts.
-- Times are milliseconds since the Unix epoch (UTC).

-- The fencing record: the epoch of the node that owns the shard. Every write transaction first
-- updates this row where the epoch still equals the writer's, so a writer with an older epoch
-- changes nothing and learns it was fenced.
CREATE TABLE shard_meta (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    shard       INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    owner       TEXT    NOT NULL,
    opened_at   INTEGER NOT NULL
);

CREATE TABLE jobs (
    id              TEXT    PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    spec            TEXT    NOT NULL,          -- JobSpec as JSON
    state           TEXT    NOT NULL,          -- active | paused | completed | deleted
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    -- when the current schedule was set (creation or the PATCH that changed it): the instant
    -- `delay` and the default `start_at` of `every` count from
    anchor_at       INTEGER NOT NULL,
    -- the next occurrence not yet fired; NULL when none (paused, completed, deleted)
    next_fire_at    INTEGER,
    idempotency_key TEXT,
    UNIQUE (tenant, idempotency_key)
);
CREATE INDEX jobs_due ON jobs (next_fire_at) WHERE next_fire_at IS NOT NULL;
CREATE INDEX jobs_tenant ON jobs (tenant, id);

-- One row per occurrence (job, scheduled time): the primary key is what makes a second run, and so
-- a second ticket, of one occurrence impossible (docs/architecture.md, "Guarantees").
-- A run of consecutive missed or skipped occurrences may be one row with range_end and count.
CREATE TABLE runs (
    job_id       TEXT    NOT NULL,
    scheduled_at INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    reason       TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    range_end    INTEGER,
    count        INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (job_id, scheduled_at)
);

-- One ticket per occurrence item; the unique key makes a second ticket for an occurrence impossible.
CREATE TABLE tickets (
    id           TEXT    PRIMARY KEY,
    job_id       TEXT    NOT NULL,
    scheduled_at INTEGER NOT NULL,
    item         INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    attempt      INTEGER NOT NULL,
    epoch        INTEGER NOT NULL,
    queue        TEXT    NOT NULL,
    body         TEXT    NOT NULL,             -- the dispatched Ticket as JSON (current attempt)
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (job_id, scheduled_at, item)
);

CREATE TABLE attempts (
    ticket_id    TEXT    NOT NULL,
    attempt      INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER,
    started_at   INTEGER,
    finished_at  INTEGER,
    worker       TEXT,
    error        TEXT,
    http_status  INTEGER,
    PRIMARY KEY (ticket_id, attempt)
);
-- The outbox: attempts written but not yet acknowledged by JetStream.
CREATE INDEX attempts_unpublished ON attempts (created_at) WHERE published_at IS NULL;
