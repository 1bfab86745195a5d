//! Requests the control plane routes to the owner of a shard over NATS request-reply, the replies,
//! and the cluster state kept in KV (shard map, node and worker heartbeats).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    growth::{ExportCursor, MovePage},
    DeadLetter, Job, JobPatch, JobSpec, RunView, TicketView,
};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ShardRequest {
    CreateJob {
        job_id: Uuid,
        spec: JobSpec,
        /// `Idempotency-Key` header of the client, if any.
        idempotency_key: Option<String>,
    },
    GetJob {
        job_id: Uuid,
    },
    ListJobs {
        tenant: Option<String>,
        after: Option<Uuid>,
        limit: u32,
        /// List workflows instead of jobs.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        workflows: bool,
    },
    PatchJob {
        job_id: Uuid,
        patch: JobPatch,
    },
    DeleteJob {
        job_id: Uuid,
    },
    PauseJob {
        job_id: Uuid,
    },
    ResumeJob {
        job_id: Uuid,
    },
    TriggerJob {
        job_id: Uuid,
    },
    ListRuns {
        job_id: Uuid,
        before: Option<DateTime<Utc>>,
        limit: u32,
    },
    GetTicket {
        ticket_id: Uuid,
    },
    /// A workflow's runs with their steps' tickets, newest first, strictly before `before`.
    ListWorkflowRuns {
        workflow_id: Uuid,
        before: Option<DateTime<Utc>>,
        limit: u32,
    },
    /// The run a step ticket belongs to (a run's id is its first step's ticket id).
    GetWorkflowRun {
        run_id: Uuid,
    },
    /// Runs a failed run's failed steps again (fresh retry budgets) and puts the steps skipped
    /// after them back to waiting, under the same run.
    RetryWorkflowRun {
        run_id: Uuid,
    },
    /// Dead letters, newest first, strictly older than the cursor `(dead_at ms, ticket id)`.
    ListDeadLetters {
        tenant: Option<String>,
        before: Option<(i64, Uuid)>,
        limit: u32,
    },
    /// Publishes a dead ticket again as its next attempt, with a fresh retry budget.
    ReplayTicket {
        ticket_id: Uuid,
    },
    GetTenant {
        tenant: String,
    },
    PauseTenant {
        tenant: String,
    },
    ResumeTenant {
        tenant: String,
    },
    /// Fires every active job of the tenant now.
    TriggerTenant {
        tenant: String,
    },
    Ping,
    /// Tenants with rows on the shard, with their job counts (which tenants a growth moves).
    ListTenants,
    /// The tenants of these routing keys leave the shard for the given shards: stop firing
    /// them and taking their writes (`Moving`) until they are released or thawed.
    FreezeKeys {
        moves: Vec<KeyTarget>,
    },
    /// Rows of frozen tenants, a page at a time.
    ExportTenants {
        tenants: Vec<String>,
        cursor: ExportCursor,
        max_bytes: u32,
    },
    /// Keeps page `seq` of the rows arriving for `key` until `CommitImport`.
    StageImport {
        key: u16,
        seq: u32,
        pages: Vec<MovePage>,
    },
    /// Makes the staged rows of `key` the shard's own, in one transaction, and fires them.
    CommitImport {
        key: u16,
    },
    /// The tenants live on their new shards now: delete their rows here, and send what still
    /// arrives for these keys (late results, stale callers) on.
    ReleaseKeys {
        moves: Vec<KeyTarget>,
        tenants: Vec<String>,
    },
    /// `time_window` growth, sent by the shard a job leaves: take these jobs (their rows) and
    /// fire them. Sent until answered (`Imported`); a copy sent again changes nothing. The
    /// sender placed them by the cluster config of `version`: a shard that has not read that
    /// version yet answers `Moving` (it would place them by older layouts).
    ImportJobs {
        version: u64,
        pages: Vec<MovePage>,
    },
    /// The job a tenant created with this idempotency key, if this shard holds it (`Job`), or
    /// `Moving` while it is on its way to another shard.
    FindKey {
        tenant: String,
        idempotency_key: String,
    },
    /// The tenants paused on this shard (what a shard added to a `time_window` cluster is
    /// given).
    ListPaused,
}

/// A routing key leaving a shard, and the shard it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTarget {
    pub key: u16,
    pub target: u32,
}

/// A tenant on a shard, with its jobs that are not deleted.
/// A run of a workflow and its steps' tickets, by item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSteps {
    pub run: RunView,
    pub steps: Vec<TicketView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantJobs {
    pub tenant: String,
    pub jobs: u64,
}

impl ShardRequest {
    /// Whether the request changes state: such a request is not sent again once it may have
    /// been delivered, because applying it twice is not harmless (a trigger would fire twice).
    pub fn is_write(&self) -> bool {
        !matches!(
            self,
            ShardRequest::GetJob { .. }
                | ShardRequest::ListJobs { .. }
                | ShardRequest::ListRuns { .. }
                | ShardRequest::GetTicket { .. }
                | ShardRequest::ListWorkflowRuns { .. }
                | ShardRequest::GetWorkflowRun { .. }
                | ShardRequest::ListDeadLetters { .. }
                | ShardRequest::GetTenant { .. }
                | ShardRequest::Ping
                | ShardRequest::ListTenants
                | ShardRequest::ExportTenants { .. }
                | ShardRequest::FindKey { .. }
                | ShardRequest::ListPaused
        )
    }

    /// Whether the request may be sent again when it may have been delivered already: reads,
    /// a create, which carries the job id the control plane minted for it (the shard answers a
    /// second copy with the job the first one created), and the steps of a tenant move, each of
    /// which leaves the same state however often it is applied.
    pub fn safe_to_resend(&self) -> bool {
        !self.is_write()
            || matches!(
                self,
                ShardRequest::CreateJob { .. }
                    | ShardRequest::FreezeKeys { .. }
                    | ShardRequest::StageImport { .. }
                    | ShardRequest::CommitImport { .. }
                    | ShardRequest::ReleaseKeys { .. }
                    | ShardRequest::ImportJobs { .. }
            )
    }

    /// The routing key of the tenant or job the request is about (job and ticket ids carry
    /// it), if it is about one; `tenant_key` gives a tenant's.
    pub fn routing_key(&self, tenant_key: impl Fn(&str) -> u16) -> Option<u16> {
        use ShardRequest as R;
        match self {
            R::CreateJob { job_id, .. }
            | R::GetJob { job_id }
            | R::PatchJob { job_id, .. }
            | R::DeleteJob { job_id }
            | R::PauseJob { job_id }
            | R::ResumeJob { job_id }
            | R::TriggerJob { job_id }
            | R::ListRuns { job_id, .. }
            | R::ListWorkflowRuns {
                workflow_id: job_id,
                ..
            } => Some(crate::ids::routing_key(*job_id)),
            R::GetTicket { ticket_id }
            | R::ReplayTicket { ticket_id }
            | R::GetWorkflowRun { run_id: ticket_id }
            | R::RetryWorkflowRun { run_id: ticket_id } => {
                Some(crate::ids::routing_key(*ticket_id))
            }
            R::ListJobs {
                tenant: Some(t), ..
            }
            | R::ListDeadLetters {
                tenant: Some(t), ..
            }
            | R::GetTenant { tenant: t }
            | R::PauseTenant { tenant: t }
            | R::ResumeTenant { tenant: t }
            | R::TriggerTenant { tenant: t } => Some(tenant_key(t)),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
// Replies are built once and serialised at once; boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum ShardReply {
    Job {
        job: Job,
        created: bool,
    },
    Jobs {
        jobs: Vec<Job>,
    },
    Runs {
        runs: Vec<RunView>,
    },
    Ticket {
        ticket: TicketView,
    },
    /// A workflow (as its job) and runs of it, each with its step tickets by item.
    WorkflowRuns {
        workflow: Job,
        runs: Vec<RunSteps>,
    },
    Triggered {
        run: RunView,
    },
    DeadLetters {
        items: Vec<DeadLetter>,
    },
    Tenant {
        tenant: TenantView,
    },
    Pong {
        shard: u32,
        epoch: u64,
        wheel_len: u64,
    },
    Tenants {
        tenants: Vec<TenantJobs>,
    },
    /// The tenants paused on the shard.
    Paused {
        tenants: Vec<String>,
    },
    /// What a shard did with jobs handed to it: the ones it holds now, and the stale copies it
    /// dropped (the job moved on from there since). Any other job of the request was not taken.
    Imported {
        held: Vec<Uuid>,
        stale: Vec<Uuid>,
    },
    Exported {
        pages: Vec<MovePage>,
        next: Option<ExportCursor>,
    },
    /// A step of a tenant move was applied; `rows` it wrote or deleted.
    MoveStep {
        rows: u64,
    },
    Error(RpcError),
}

/// Error codes a shard node answers with; the control plane maps each to one HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RpcErrorCode {
    NotFound,
    Validation,
    Conflict,
    IdempotencyKeyReused,
    Fenced,
    NotOwner,
    Internal,
    /// The tenant creates faster than `tenant_create_rate` allows; `retry_after_ms` says when
    /// the next create fits.
    RateLimited,
    /// The tenant has `tenant_max_jobs` jobs that can still fire.
    QuotaExceeded,
    /// The tenant is moving to another shard (or has moved): ask again, by the newest
    /// placement.
    Moving,
    /// A create's idempotency key belongs to a job that moved to another shard: look for the
    /// key on the key's shards again.
    Moved,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct RpcError {
    pub code: RpcErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For `RateLimited`: how long until the request would be taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl RpcError {
    pub fn new(code: RpcErrorCode, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            field: None,
            retry_after_ms: None,
        }
    }
}

/// A tenant's state on its shard (`GET /v1/tenants/{tenant}`, and the answer to pause, resume
/// and trigger).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub tenant: String,
    /// While paused, none of the tenant's jobs fires; each job keeps its own paused or active
    /// state, so resuming the tenant does not resume a job paused on its own.
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<DateTime<Utc>>,
    /// Jobs of the tenant that are not deleted.
    pub jobs: u64,
    /// Occurrences fired by a tenant-wide trigger (absent for other requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggered: Option<u64>,
    /// In a `time_window` cluster, where the tenant's jobs spread over every shard: on how many
    /// of its shards (`shards`) the tenant is paused. `paused` is true only when it is paused on
    /// all of them; fewer means a pause or resume did not reach every shard yet (send it
    /// again). Absent in a `tenant` cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_shards: Option<u32>,
    /// In a `time_window` cluster: the shards the tenant's state was read from (every shard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
}

/// Who owns a shard, under which epoch (the fencing token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ShardAssignment {
    pub shard: u32,
    pub owner: String,
    pub epoch: u64,
}

/// What a cluster is created with, written once by the control plane that creates it; a control
/// plane started later with other values refuses to start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterConfig {
    /// Shards that exist now: 0 to `shard_count - 1`.
    pub shard_count: u32,
    /// Absent in the config of a cluster created before job ids carried their routing key.
    #[serde(default)]
    pub job_ids: JobIds,
    /// Absent in the config of a cluster created before the mode was a choice.
    #[serde(default)]
    pub sharding: Sharding,
    /// Goes up by one with every change (shards added, a tenant moved).
    #[serde(default)]
    pub version: u64,
    /// The shard count the cluster was created with (absent: it never grew).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_with: Option<u32>,
    /// Present while added shards take over their tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<crate::growth::Growth>,
    /// The layouts of a `time_window` cluster (absent in a `tenant` one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Windows>,
}

/// How a `time_window` cluster spreads occurrences over its shards: due time is cut into windows
/// of `window_secs`, and each window is laid out over the shards of the layout in force for it.
/// A layout never changes once written; adding shards appends one for later windows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Windows {
    /// Length of a window of due time, in seconds.
    pub window_secs: u32,
    /// Oldest first; the first lays out every window before the second's, and so on.
    pub layouts: Vec<Layout>,
}

/// The shards the windows from `from_window` on are spread over (until the next layout's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Layout {
    /// The first window laid out so: its start in seconds since the Unix epoch over
    /// `window_secs`.
    pub from_window: i64,
    /// The layout's shards: 0 to `shards - 1`.
    pub shards: u32,
}

impl Windows {
    /// Length of a window of a new `time_window` cluster.
    pub const DEFAULT_WINDOW_SECS: u32 = 60;

    /// The shards of the layout in force at `at_ms` (ms since the Unix epoch): the newest
    /// starting at or before its window (the oldest before every layout).
    pub fn shards_at(&self, at_ms: i64) -> u32 {
        let window = at_ms.div_euclid(i64::from(self.window_secs.max(1)) * 1_000);
        let in_force = (self.layouts.iter())
            .filter(|l| l.from_window <= window)
            .max_by_key(|l| l.from_window)
            .or_else(|| self.layouts.iter().min_by_key(|l| l.from_window));
        in_force.map_or(1, |l| l.shards.max(1))
    }
}

impl ClusterConfig {
    /// The config a new cluster gets.
    pub fn new(shard_count: u32, sharding: Sharding) -> ClusterConfig {
        let windows = (sharding == Sharding::TimeWindow).then(|| Windows {
            window_secs: Windows::DEFAULT_WINDOW_SECS,
            layouts: vec![Layout {
                from_window: 0,
                shards: shard_count,
            }],
        });
        ClusterConfig {
            shard_count,
            job_ids: JobIds::TenantKey,
            sharding,
            version: 1,
            created_with: None,
            growth: None,
            windows,
        }
    }

    /// The shard count the cluster was created with.
    pub fn initial_shard_count(&self) -> u32 {
        self.created_with.unwrap_or(self.shard_count)
    }

    /// The layouts of a `time_window` cluster that jobs are placed by: all of them, except while
    /// shards are being added, when the newest is not in force yet (its added shards first get
    /// what they need, the tenants paused on the others).
    pub fn windows_in_force(&self) -> Option<Windows> {
        let mut windows = self.windows.clone()?;
        if self.growth.is_some() && windows.layouts.len() > 1 {
            windows.layouts.pop();
        }
        Some(windows)
    }
}

/// How jobs are spread over shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(feature = "clap", value(rename_all = "snake_case"))]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// A tenant's jobs live in one shard, chosen by consistent hashing of the tenant.
    #[default]
    Tenant,
    /// Occurrences are partitioned by windows of due time, each window spread over the shards
    /// of its layout by job.
    TimeWindow,
}

impl std::fmt::Display for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sharding::Tenant => "tenant",
            Sharding::TimeWindow => "time_window",
        })
    }
}

/// How the control plane finds the shard of a job from the job's id alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobIds {
    /// Clusters created by earlier versions: every create recorded `job id → tenant` in the KV
    /// bucket `names::JOB_INDEX_BUCKET`, and tenants map to shards by their name.
    #[default]
    Indexed,
    /// The last 16 bits of a job id are its routing key: its tenant's in a `tenant` cluster
    /// (tenants map to shards by it), the job's own in a `time_window` one. No index, so nothing
    /// outside the shard databases grows with the job count.
    TenantKey,
}

/// A shard node's heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeInfo {
    pub node_id: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Shards this node has open and serving.
    pub shards: Vec<u32>,
    /// Version of the cluster settings the node runs (0: none read yet).
    #[serde(default)]
    pub settings_version: u64,
    /// The node's clock minus the NATS server's, in milliseconds; absent until measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<f64>,
    /// The node's failure domain (`--zone`), passed to the assignment strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The operator's labels of the node (`--label KEY=VALUE`), passed to the assignment
    /// strategy (the zone-affinity example reads `db_zone`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Occurrences held in the time wheels of its open shards.
    #[serde(default)]
    pub wheel_size: u64,
    /// Ticket attempts its open shards have written and not seen finish: waiting to be
    /// published, queued for a worker, or running.
    #[serde(default)]
    pub in_flight: u64,
    /// CPU its process used between its two latest heartbeats, in cores (1.0: one core busy).
    #[serde(default)]
    pub cpu_share: f64,
    /// The most shards it may own (`--max-shards`); absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_shards: Option<u32>,
}

/// The control-plane leader's lease, kept under one KV key and renewed by compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaderLease {
    /// Id of the replica that holds it.
    pub holder: String,
    /// Goes up by one with every change of holder.
    pub term: u64,
    /// How long the lease lasts after a renewal, as the holder counts it.
    pub ttl_ms: u64,
    /// The holder's clock at the renewal (for people; nobody compares clocks with it).
    pub renewed_at: DateTime<Utc>,
}

/// A control-plane replica's heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaInfo {
    pub id: String,
    /// Where its REST API listens.
    pub http: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// The binary's version.
    pub version: String,
}

/// A worker's answer to a drain request (`names::worker_drain_subject`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DrainReply {
    pub worker_id: String,
    /// Always true: the worker stopped taking tickets and finishes what it runs.
    pub draining: bool,
    /// Tickets running when the request arrived.
    pub in_flight: u32,
}

/// A shard's question to the worker that started an attempt (`names::worker_attempts_subject`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AttemptRequest {
    /// Does the attempt still run there? Asked by the watchdog before it declares it lost.
    Probe { ticket_id: Uuid, attempt: u32 },
    /// Stop running the attempt: it was replaced by a newer occurrence (overlap `replace`).
    Cancel {
        ticket_id: Uuid,
        attempt: u32,
        reason: String,
    },
}

/// Where an attempt stands on the worker asked about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Its handler runs here (for a cancel: it ran, and was told to stop).
    Running,
    /// It ended here and its result is on its way (journalled, not yet stored).
    Finished,
    /// Not running here: never started, or ended and reported.
    Unknown,
}

/// A worker's answer to an `AttemptRequest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptReply {
    pub worker_id: String,
    pub state: AttemptState,
}

/// A worker's heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerInfo {
    pub worker_id: String,
    pub queues: Vec<String>,
    pub heartbeat_at: DateTime<Utc>,
    pub in_flight: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's limits are shared by the shards of the layout in force: the old ones until a
    /// growth's layout starts, all of them from then on; while the growth readies its shards,
    /// the new layout is not in force at all.
    #[test]
    fn the_shards_in_force_follow_the_layouts() {
        let mut c = ClusterConfig::new(4, Sharding::TimeWindow);
        c.shard_count = 8;
        (c.windows.as_mut().unwrap().layouts).push(Layout {
            from_window: 10,
            shards: 8,
        });
        let w = c.windows.clone().unwrap();
        assert_eq!((w.shards_at(599_999), w.shards_at(600_000)), (4, 8));
        assert_eq!(w.shards_at(-1), 4);
        c.growth = Some(crate::growth::Growth {
            from: 4,
            started_at: chrono::Utc::now(),
            sealed: vec![],
            moved: vec![],
            moving: None,
            tenants_moved: 0,
            recent: vec![],
        });
        assert_eq!(c.windows_in_force().unwrap().shards_at(600_000), 4);
        assert_eq!(
            ClusterConfig::new(4, Sharding::Tenant).windows_in_force(),
            None
        );
    }

    /// Reads and creates may go out twice; a trigger (it would fire twice), a delete or a
    /// replay (the second copy would answer a conflict) may not.
    #[test]
    fn only_reads_and_creates_are_resent() {
        let job_id = Uuid::now_v7();
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "tenant": "t", "name": "n", "schedule": {"every": "1s"},
            "target": {"type": "queue", "queue": "q"}
        }))
        .unwrap();
        let create = ShardRequest::CreateJob {
            job_id,
            spec,
            idempotency_key: None,
        };
        assert!(create.is_write() && create.safe_to_resend());
        assert!(ShardRequest::GetJob { job_id }.safe_to_resend());
        for write in [
            ShardRequest::TriggerJob { job_id },
            ShardRequest::DeleteJob { job_id },
            ShardRequest::ReplayTicket { ticket_id: job_id },
        ] {
            assert!(!write.safe_to_resend(), "{write:?}");
        }
    }
}
