//! Which shard holds a tenant or a job (`placement`, pure), and calling the owner of a shard
//! over NATS request-reply, or through `LocalShards` when the owner runs in this process.

mod placement;

use std::time::Duration;

use chronoshard_cluster::LocalShards;
use chronoshard_wire::{
    names,
    rpc::{ClusterConfig, JobIds, RpcError, RpcErrorCode, ShardReply, ShardRequest},
};
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

pub use placement::Placement;

/// Why a call to a shard brought no reply to use. The API maps it to its answers
/// (`api::error`); nothing here knows HTTP.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The shard answered with an error.
    #[error("{0}")]
    Shard(RpcError),
    /// Nobody answered; `maybe_applied` when the request may have been received.
    #[error("{why}")]
    Unavailable { why: String, maybe_applied: bool },
    /// The reply could not be read.
    #[error("bad reply from shard {shard}: {detail}")]
    BadReply { shard: u32, detail: String },
}

impl CallError {
    /// Whether the shard said there is no such job or ticket.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CallError::Shard(e) if e.code == RpcErrorCode::NotFound)
    }
}

fn unavailable(why: String) -> CallError {
    CallError::Unavailable {
        why,
        maybe_applied: false,
    }
}

/// How long a call keeps retrying while a shard is moving or its owner is starting: well past a
/// failover after a node dies (its heartbeat TTL, 1.5 s by default, then an assignment pass and
/// the shard's opening) and a NATS stream leader's re-election, so a create in that window waits
/// for the new owner instead of failing.
const CALL_DEADLINE: Duration = Duration::from_secs(12);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// What became of one request.
// Short-lived and matched at once; boxing the reply would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Attempt {
    Reply(Result<ShardReply, CallError>),
    /// Nobody received it: safe to send again.
    NotDelivered(String),
    /// It may have been received.
    Unknown(String),
}

/// Where a request goes: a shard, or wherever a tenant or an id lives at the moment it is
/// sent (a call retried while its tenant moves follows the tenant).
#[derive(Clone, Copy, Debug)]
pub enum Route<'a> {
    Shard(u32),
    Tenant(&'a str),
    /// A job or ticket id (in a cluster whose ids carry their routing key).
    Id(Uuid),
    /// A job being created, by its new id.
    NewJob(Uuid),
}

impl From<u32> for Route<'_> {
    fn from(shard: u32) -> Self {
        Route::Shard(shard)
    }
}

/// Maps tenants and jobs to shards and calls shard owners.
#[derive(Clone)]
pub struct Router {
    client: async_nats::Client,
    placement: watch::Receiver<Placement>,
    local: LocalShards,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("placement", &*self.placement.borrow())
            .finish()
    }
}

impl Router {
    /// A router that places by `config` as it changes (shards added, tenants moved).
    pub fn new(
        client: async_nats::Client,
        config: watch::Receiver<ClusterConfig>,
        local: LocalShards,
    ) -> Router {
        Router {
            client,
            placement: follow_placement(config),
            local,
        }
    }

    /// The placement in force now.
    pub fn placement(&self) -> Placement {
        self.placement.borrow().clone()
    }

    pub fn shard_count(&self) -> u32 {
        self.placement.borrow().shard_count()
    }

    pub fn job_ids(&self) -> JobIds {
        self.placement.borrow().job_ids()
    }

    pub fn shard_for_tenant(&self, tenant: &str) -> u32 {
        self.placement.borrow().shard_for_tenant(tenant)
    }

    /// Whether a tenant's jobs spread over every shard (`Placement::spreads_tenants`).
    pub fn spreads_tenants(&self) -> bool {
        self.placement.borrow().spreads_tenants()
    }

    /// A new job id on a shard not in `tried` (`Placement::mint_job_id_avoiding`).
    pub fn mint_job_id_avoiding(&self, tenant: &str, tried: &[u32]) -> Option<Uuid> {
        (self.placement.borrow()).mint_job_id_avoiding(tenant, tried, now_ms())
    }

    /// A new job id (`Placement::mint_job_id`).
    pub fn mint_job_id(&self, tenant: &str, idempotency_key: Option<&str>) -> Uuid {
        self.placement.borrow().mint_job_id(tenant, idempotency_key)
    }

    pub fn shard_for_id(&self, id: Uuid) -> Option<u32> {
        self.placement.borrow().shard_for_id(id)
    }

    /// Whether `shard` holds the job or ticket `id` now (`Placement::holds`).
    pub fn holds(&self, shard: u32, id: Uuid) -> bool {
        self.placement.borrow().holds(shard, id)
    }

    /// The shard a create of job `id` goes to now (`Placement::shard_for_new_job`).
    pub fn shard_for_new_job(&self, id: Uuid) -> u32 {
        self.placement.borrow().shard_for_new_job(id, now_ms())
    }

    /// The shards to ask, in order: the first that does not answer "not found" answers.
    fn resolve(&self, route: Route<'_>) -> Vec<u32> {
        match route {
            Route::Shard(s) => vec![s],
            Route::Tenant(t) => vec![self.shard_for_tenant(t)],
            Route::Id(id) => self.placement.borrow().shards_for_id(id),
            Route::NewJob(id) => vec![self.shard_for_new_job(id)],
        }
    }

    /// Sends a request to the owner of the shard `route` leads to. Retries while nobody serves
    /// the shard (it is moving or its owner is starting) or the tenant is moving (the route is
    /// followed afresh each time); a request that is safe to resend (a read, a create) is also
    /// retried after a timeout, any other write is not, since it may have been applied. Error
    /// replies of the shard come back as `CallError::Shard`.
    pub async fn call<'a>(
        &self,
        route: impl Into<Route<'a>>,
        req: &ShardRequest,
    ) -> Result<ShardReply, CallError> {
        let route = route.into();
        let deadline = tokio::time::Instant::now() + CALL_DEADLINE;
        let mut backoff = Duration::from_millis(20);
        loop {
            let shards = self.resolve(route);
            let (shard, attempt) = self.attempt_each(&shards, req).await;
            let why = match attempt {
                // Nothing was applied: the shard refuses every request about a moving tenant.
                Attempt::Reply(Err(CallError::Shard(e))) if e.code == RpcErrorCode::Moving => {
                    e.message
                }
                Attempt::Reply(r) => return r,
                Attempt::NotDelivered(why) => why,
                Attempt::Unknown(why) if req.safe_to_resend() => why,
                Attempt::Unknown(why) => {
                    return Err(CallError::Unavailable {
                        why,
                        maybe_applied: true,
                    })
                }
            };
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(unavailable(why));
            }
            // A tenant that moved is found by the placement's next change.
            let mut placement = self.placement.clone();
            placement.borrow_and_update();
            let _ = tokio::time::timeout(backoff, placement.changed()).await;
            tracing::debug!(shard, %why, "retrying shard call");
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Asks `shards` in turn until one answers other than "not found" (a job is in one
    /// shard's table at a time, so that one holds it). A shard that does not answer is passed
    /// over for the next; if none holds it, the first silence is the answer (that shard may
    /// hold it), else "not found".
    async fn attempt_each(&self, shards: &[u32], req: &ShardRequest) -> (u32, Attempt) {
        let mut silent = None;
        let mut last = None;
        for &shard in shards {
            match self.attempt(shard, req).await {
                Attempt::Reply(Err(e)) if e.is_not_found() => last = Some((shard, e)),
                // A write that may have been applied there is not sent on.
                a @ Attempt::NotDelivered(_) if shards.len() > 1 => {
                    silent.get_or_insert((shard, a));
                }
                a @ Attempt::Unknown(_) if shards.len() > 1 && req.safe_to_resend() => {
                    silent.get_or_insert((shard, a));
                }
                other => return (shard, other),
            }
        }
        match (silent, last) {
            (Some(s), _) => s,
            (None, Some((shard, e))) => (shard, Attempt::Reply(Err(e))),
            (None, None) => unreachable!("at least one shard is asked"),
        }
    }

    /// One request to the owner of `shard`, without retries.
    pub async fn call_once(&self, shard: u32, req: &ShardRequest) -> Result<ShardReply, CallError> {
        match self.attempt(shard, req).await {
            Attempt::Reply(r) => r,
            Attempt::NotDelivered(why) | Attempt::Unknown(why) => Err(unavailable(why)),
        }
    }

    async fn attempt(&self, shard: u32, req: &ShardRequest) -> Attempt {
        if let Some(calls) = self.local.get(shard) {
            let (tx, rx) = oneshot::channel();
            // A closed queue: the shard stopped here since; NATS finds its owner.
            if calls.send((req.clone(), tx)).await.is_ok() {
                return local_attempt(shard, rx).await;
            }
        }
        let body = serde_json::to_vec(req).expect("request serialises");
        let request = self
            .client
            .request(names::shard_rpc_subject(shard), body.into());
        match tokio::time::timeout(ATTEMPT_TIMEOUT, request).await {
            Ok(Ok(msg)) => {
                Attempt::Reply(match serde_json::from_slice::<ShardReply>(&msg.payload) {
                    Ok(ShardReply::Error(e)) => Err(CallError::Shard(e)),
                    Ok(reply) => Ok(reply),
                    Err(e) => Err(CallError::BadReply {
                        shard,
                        detail: e.to_string(),
                    }),
                })
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                Attempt::NotDelivered(format!("shard {shard} is not served right now"))
            }
            Ok(Err(e)) => Attempt::Unknown(format!("shard {shard}: {e}")),
            Err(_) => Attempt::Unknown(format!(
                "shard {shard} did not answer within {ATTEMPT_TIMEOUT:?}"
            )),
        }
    }

    /// Sends a request to every shard at once and returns the replies in shard order.
    pub async fn call_all(&self, req: &ShardRequest) -> Vec<Result<ShardReply, CallError>> {
        futures::future::join_all((0..self.shard_count()).map(|s| self.call(s, req))).await
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A channel holding the placement of the config's latest value.
fn follow_placement(mut config: watch::Receiver<ClusterConfig>) -> watch::Receiver<Placement> {
    let (tx, rx) = watch::channel(Placement::of(&config.borrow_and_update()));
    tokio::spawn(async move {
        while config.changed().await.is_ok() {
            let placement = Placement::of(&config.borrow_and_update());
            if tx.send(placement).is_err() {
                return;
            }
        }
    });
    rx
}

/// The answer of a shard served in this process. Over NATS a shard that lost its epoch or is
/// closing stays silent; here it answers, and that answer means what silence means: the request
/// may have been applied in part (a tenant's trigger fires job by job, each in its own
/// transaction, and the fence may stop it half way), so only a request safe to resend goes
/// again. A call the shard never took went nowhere and may go again.
async fn local_attempt(shard: u32, reply: oneshot::Receiver<Option<ShardReply>>) -> Attempt {
    match tokio::time::timeout(ATTEMPT_TIMEOUT, reply).await {
        Ok(Ok(None)) => Attempt::NotDelivered(format!("shard {shard} stopped here")),
        Ok(Ok(Some(ShardReply::Error(RpcError {
            code: RpcErrorCode::Fenced | RpcErrorCode::NotOwner,
            message,
            ..
        })))) => Attempt::Unknown(format!("shard {shard}: {message}")),
        Ok(Ok(Some(ShardReply::Error(e)))) => Attempt::Reply(Err(CallError::Shard(e))),
        Ok(Ok(Some(reply))) => Attempt::Reply(Ok(reply)),
        Ok(Err(_)) => Attempt::Unknown(format!("shard {shard} stopped while answering")),
        Err(_) => Attempt::Unknown(format!(
            "shard {shard} did not answer within {ATTEMPT_TIMEOUT:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the caller hears: `None` = the shard dropped the reply without answering.
    async fn answered(reply: Option<Option<ShardReply>>) -> Attempt {
        let (tx, rx) = oneshot::channel();
        match reply {
            Some(r) => tx.send(r).unwrap(),
            None => drop(tx),
        }
        local_attempt(5, rx).await
    }

    fn error(code: RpcErrorCode) -> Option<Option<ShardReply>> {
        Some(Some(ShardReply::Error(RpcError::new(code, "why"))))
    }

    /// A fenced or closing shard, or one that stopped while answering, may have applied the
    /// request (as silence over NATS says); one that never took the call did not.
    #[tokio::test]
    async fn a_local_shards_answers_mean_what_they_mean_over_nats() {
        let fenced = answered(error(RpcErrorCode::Fenced)).await;
        assert!(matches!(fenced, Attempt::Unknown(w) if w == "shard 5: why"));
        let closing = answered(error(RpcErrorCode::NotOwner)).await;
        assert!(matches!(closing, Attempt::Unknown(_)));
        let dropped = answered(None).await;
        assert!(matches!(dropped, Attempt::Unknown(w) if w.contains("stopped while")));
        let not_taken = answered(Some(None)).await;
        assert!(matches!(not_taken, Attempt::NotDelivered(_)));
        assert!(matches!(
            answered(error(RpcErrorCode::NotFound)).await,
            Attempt::Reply(Err(e)) if e.is_not_found()
        ));
        let pong = ShardReply::Pong {
            shard: 5,
            epoch: 2,
            wheel_len: 0,
        };
        assert!(matches!(
            answered(Some(Some(pong))).await,
            Attempt::Reply(Ok(ShardReply::Pong { epoch: 2, .. }))
        ));
    }
}
