-- Jobs holding a buffered occurrence (`overlap: buffer_one`), which a shard looks up when it
-- opens. Without this index that lookup read every job: 7.7 s per shard at 10 million jobs
-- (shard-node/benches/scale.rs), during which the shard took no writes.
CREATE INDEX jobs_buffered ON jobs (id) WHERE buffered_at IS NOT NULL;
