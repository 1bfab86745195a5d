//! The leader lease's key: read, create, renew and give up by compare-and-swap, and watch. Who
//! may do which, and when, is the control plane's `leader` module; this only moves the bytes.

use async_nats::jetstream::kv;
use chronoshard_wire::{names, rpc::LeaderLease};

use crate::{
    nats,
    read::{decode, to_bytes},
    Cluster, Error, Result,
};

/// The lease key as last written: its value (None once deleted) and revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseEntry {
    pub lease: Option<LeaderLease>,
    pub revision: u64,
}

impl LeaseEntry {
    fn of(e: kv::Entry) -> Result<LeaseEntry> {
        let lease = match e.operation {
            kv::Operation::Put => Some(decode(&e.value, "leader lease")?),
            kv::Operation::Delete | kv::Operation::Purge => None,
        };
        Ok(LeaseEntry {
            lease,
            revision: e.revision,
        })
    }
}

impl Cluster {
    /// The lease key now (None: never written, or expired out of the bucket).
    pub async fn lease(&self) -> Result<Option<LeaseEntry>> {
        self.buckets
            .control
            .entry(names::LEADER_KEY)
            .await
            .map_err(nats("read the leader lease"))?
            .map(LeaseEntry::of)
            .transpose()
    }

    /// Writes the lease if the key is at `revision` (None: the key must be absent, or deleted).
    /// Returns the new revision; `Conflict` when someone else wrote it first.
    pub async fn write_lease(&self, lease: &LeaderLease, revision: Option<u64>) -> Result<u64> {
        let conflict = || Error::Conflict {
            what: "leader lease",
        };
        let bytes = to_bytes(lease);
        match revision {
            None => self
                .buckets
                .control
                .create(names::LEADER_KEY, bytes)
                .await
                .map_err(|e| match e.kind() {
                    kv::CreateErrorKind::AlreadyExists => conflict(),
                    _ => nats("take the leader lease")(e),
                }),
            Some(rev) => self
                .buckets
                .control
                .update(names::LEADER_KEY, bytes, rev)
                .await
                .map_err(|e| match e.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => conflict(),
                    _ => nats("renew the leader lease")(e),
                }),
        }
    }

    /// Gives the lease up (a clean stop), unless someone else holds it by now.
    pub async fn release_lease(&self, revision: u64) -> Result<()> {
        self.buckets
            .control
            .delete_expect_revision(names::LEADER_KEY, Some(revision))
            .await
            .map_err(nats("release the leader lease"))
    }

    /// A watch over the lease key: its current value, then every change.
    pub async fn watch_lease(&self) -> Result<LeaseWatch> {
        let inner = self
            .buckets
            .control
            .watch_with_history(names::LEADER_KEY)
            .await
            .map_err(nats("watch the leader lease"))?;
        Ok(LeaseWatch { inner })
    }
}

/// The lease key's changes, decoded.
pub struct LeaseWatch {
    inner: kv::Watch,
}

impl LeaseWatch {
    /// The next change; None when the watch ended (open a new one).
    pub async fn next(&mut self) -> Option<Result<LeaseEntry>> {
        use futures::StreamExt;
        match self.inner.next().await? {
            Ok(e) => Some(LeaseEntry::of(e)),
            Err(e) => Some(Err(nats("watch the leader lease")(e))),
        }
    }
}
