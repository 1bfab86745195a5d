-- One shard's database on Postgres: the same tables as migrations/sqlite (0001 and 0002 there),
-- created in the shard's own schema (`shard_<id>`, set as search_path by the store).
-- Times are milliseconds since the Unix epoch (UTC). Integers are BIGINT so one set of queries
-- reads both backends as 64-bit. Text keys use the "C" collation: ids compare byte by byte, so
-- UUIDv7 order is creation order whatever the database's locale.

CREATE TABLE shard_meta (
    id          BIGINT  PRIMARY KEY CHECK (id = 1),
    shard       BIGINT  NOT NULL,
    epoch       BIGINT  NOT NULL,
    owner       TEXT    NOT NULL,
    opened_at   BIGINT  NOT NULL
);

CREATE TABLE jobs (
    id              TEXT COLLATE "C" PRIMARY KEY,
    tenant          TEXT COLLATE "C" NOT NULL,
    spec            TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL,
    anchor_at       BIGINT  NOT NULL,
    next_fire_at    BIGINT,
    idempotency_key TEXT,
    buffered_at     BIGINT,
    priority        BIGINT  NOT NULL DEFAULT 5,
    UNIQUE (tenant, idempotency_key)
);
CREATE INDEX jobs_due ON jobs (next_fire_at) WHERE next_fire_at IS NOT NULL;
CREATE INDEX jobs_tenant ON jobs (tenant, id);

CREATE TABLE runs (
    job_id       TEXT COLLATE "C" NOT NULL,
    scheduled_at BIGINT  NOT NULL,
    status       TEXT    NOT NULL,
    reason       TEXT,
    attempts     BIGINT  NOT NULL DEFAULT 0,
    range_end    BIGINT,
    count        BIGINT,
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL,
    PRIMARY KEY (job_id, scheduled_at)
);
CREATE INDEX runs_active ON runs (job_id) WHERE status IN ('dispatched', 'running', 'retrying');

CREATE TABLE tickets (
    id           TEXT COLLATE "C" PRIMARY KEY,
    job_id       TEXT COLLATE "C" NOT NULL,
    scheduled_at BIGINT  NOT NULL,
    item         BIGINT  NOT NULL,
    status       TEXT    NOT NULL,
    attempt      BIGINT  NOT NULL,
    epoch        BIGINT  NOT NULL,
    queue        TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL,
    timeout_ms   BIGINT,
    attempt_base BIGINT  NOT NULL DEFAULT 0,
    dead_at      BIGINT,
    UNIQUE (job_id, scheduled_at, item)
);
CREATE INDEX tickets_dead ON tickets (dead_at, id) WHERE dead_at IS NOT NULL;

CREATE TABLE attempts (
    ticket_id    TEXT COLLATE "C" NOT NULL,
    attempt      BIGINT  NOT NULL,
    status       TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    published_at BIGINT,
    started_at   BIGINT,
    finished_at  BIGINT,
    worker       TEXT,
    error        TEXT,
    http_status  BIGINT,
    not_before   BIGINT,
    heartbeat_at BIGINT,
    PRIMARY KEY (ticket_id, attempt)
);
CREATE INDEX attempts_unpublished ON attempts (created_at) WHERE published_at IS NULL;
CREATE INDEX attempts_open ON attempts (ticket_id, attempt) WHERE finished_at IS NULL;

CREATE TABLE paused_tenants (
    tenant    TEXT COLLATE "C" PRIMARY KEY,
    paused_at BIGINT NOT NULL
);
