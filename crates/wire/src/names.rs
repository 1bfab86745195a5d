//! Names shared by every process: JetStream streams, subjects, KV buckets and message headers.
//! A name here is part of docs/protocol.md; change both together.

/// Stream holding execution tickets, one subject per queue.
pub const DISPATCH_STREAM: &str = "CHRONOSHARD_DISPATCH";
pub const DISPATCH_SUBJECTS: &str = "chronoshard.dispatch.>";
/// Stream holding worker results, one subject per shard.
pub const RESULT_STREAM: &str = "CHRONOSHARD_RESULTS";
pub const RESULT_SUBJECTS: &str = "chronoshard.results.>";

/// KV bucket: node id → `NodeInfo` heartbeat (an entry goes a minute after its last heartbeat;
/// the settings' TTL decides liveness).
pub const NODES_BUCKET: &str = "chronoshard_nodes";
/// KV bucket: `shard.<id>` → `ShardAssignment`, `config` → `ClusterConfig`, `settings` →
/// `VersionedSettings`, `strategy` → `VersionedStrategy`, `drain.<node id>` → the time a drain
/// was asked for.
pub const SHARDS_BUCKET: &str = "chronoshard_shards";
/// KV bucket: `leader` → `LeaderLease`, `replica.<id>` → `ReplicaInfo` heartbeat.
pub const CONTROL_BUCKET: &str = "chronoshard_control";
/// KV bucket: job id → tenant, so a job is found from its id alone.
pub const JOB_INDEX_BUCKET: &str = "chronoshard_job_index";
/// KV bucket: worker id → `WorkerInfo` heartbeat.
pub const WORKERS_BUCKET: &str = "chronoshard_workers";

/// Key of the cluster configuration in `SHARDS_BUCKET`.
pub const CLUSTER_CONFIG_KEY: &str = "config";
/// Key of the live settings in `SHARDS_BUCKET`.
pub const SETTINGS_KEY: &str = "settings";
/// Key of the active assignment strategy in `SHARDS_BUCKET`.
pub const STRATEGY_KEY: &str = "strategy";
/// Key of the leader lease in `CONTROL_BUCKET`.
pub const LEADER_KEY: &str = "leader";

/// Key in `SHARDS_BUCKET` that marks a node as draining.
pub fn drain_key(node_id: &str) -> String {
    format!("drain.{node_id}")
}

/// Key in `SHARDS_BUCKET` of an API token's record.
pub fn token_key(id: &uuid::Uuid) -> String {
    format!("token.{id}")
}

/// The keys of every API token's record in `SHARDS_BUCKET`.
pub const TOKEN_KEYS: &str = "token.*";

/// Key of a control-plane replica's heartbeat in `CONTROL_BUCKET`.
pub fn replica_key(id: &str) -> String {
    format!("replica.{id}")
}

/// Header carrying the ticket id on dispatch messages (the body carries it too).
pub const HDR_TICKET_ID: &str = "Chronoshard-Ticket-Id";
/// Header carrying the attempt number on dispatch messages.
pub const HDR_ATTEMPT: &str = "Chronoshard-Attempt";

/// Header carrying the shard on dispatch messages, so a worker can report on a message whose
/// body it cannot read.
pub const HDR_SHARD: &str = "Chronoshard-Shard";

/// W3C trace context on dispatch and result messages, when traces are exported: on a ticket it
/// names the shard's `publish` span, on a result the worker's `attempt` span
/// (docs/operations.md "Traces"). Also the HTTP header of an executor's call.
pub const TRACEPARENT: &str = "traceparent";

/// Headers a worker sends with an HTTP target (docs/protocol.md).
pub const HTTP_IDEMPOTENCY_KEY: &str = "Idempotency-Key";
pub const HTTP_JOB_ID: &str = "X-Chronoshard-Job-Id";
pub const HTTP_SCHEDULED_AT: &str = "X-Chronoshard-Scheduled-At";
pub const HTTP_ATTEMPT: &str = "X-Chronoshard-Attempt";

pub fn dispatch_subject(queue: &str) -> String {
    format!("chronoshard.dispatch.{queue}")
}

pub fn result_subject(shard: u32) -> String {
    format!("chronoshard.results.{shard}")
}

/// Request-reply subject served by the current owner of a shard.
pub fn shard_rpc_subject(shard: u32) -> String {
    format!("chronoshard.shard.{shard}.rpc")
}

pub fn shard_key(shard: u32) -> String {
    format!("shard.{shard}")
}

/// Core NATS subject a worker answers drain requests on (`POST /v1/workers/{id}/drain`).
pub fn worker_drain_subject(worker_id: &str) -> String {
    format!("chronoshard.workers.{worker_id}.drain")
}

/// Core NATS subject a worker answers a shard's questions about its attempts on: whether it
/// still runs one (the watchdog's probe), and to stop one (overlap `replace`).
pub fn worker_attempts_subject(worker_id: &str) -> String {
    format!("chronoshard.workers.{worker_id}.attempts")
}

/// Whether `id` can name a worker (or a queue): the job spec's token rule (1-64 of
/// `A-Z a-z 0-9 _ -`), so it is one NATS subject token and one file name.
pub fn valid_worker_id(id: &str) -> bool {
    crate::job::check_token("id", id, 64).is_ok()
}

/// Durable consumer name of the workers of one queue.
pub fn worker_consumer(queue: &str) -> String {
    format!("worker-{queue}")
}

/// Durable consumer name of the results of one shard.
pub fn result_consumer(shard: u32) -> String {
    format!("shard-{shard}-results")
}
