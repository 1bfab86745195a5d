-- The lost-ticket sweep: a published attempt that never started is checked against the dispatch
-- stream by the JetStream sequence its publish was stored under, and sent again when JetStream no
-- longer holds it. `resends` counts those sends (it also makes each send's Nats-Msg-Id distinct).
ALTER TABLE attempts ADD COLUMN publish_seq INTEGER;
ALTER TABLE attempts ADD COLUMN resends INTEGER NOT NULL DEFAULT 0;
CREATE INDEX attempts_unstarted ON attempts (published_at)
    WHERE published_at IS NOT NULL AND started_at IS NULL AND finished_at IS NULL;
