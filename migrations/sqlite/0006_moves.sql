-- Online shard growth: the tenants of a routing key move, all their rows at once, from this shard
-- to another (the target), copied in pages that the control plane relays.

-- On the target: the pages of a routing key received so far, as sent. They reach the real tables
-- only when the move commits, all in one transaction, so a shard never holds part of a tenant;
-- a move rolled back drops them. `seq` numbers the sends: a page set sent again replaces itself.
CREATE TABLE staged_imports (
    key        INTEGER NOT NULL,           -- the routing key the pages belong to
    seq        INTEGER NOT NULL,
    body       TEXT    NOT NULL,           -- the pages as JSON
    created_at INTEGER NOT NULL,
    PRIMARY KEY (key, seq)
);

-- On the source: routing keys leaving this shard for shard `target`. `frozen` while their rows are
-- copied (their tenants must not change meanwhile), `gone` once the rows live on the target and
-- were deleted here; what is addressed to a gone key belongs to the target. Kept in the shard's
-- database so that a node taking the shard over knows it too.
CREATE TABLE key_moves (
    key        INTEGER PRIMARY KEY,
    target     INTEGER NOT NULL,
    state      TEXT    NOT NULL,           -- frozen | gone
    updated_at INTEGER NOT NULL
);
