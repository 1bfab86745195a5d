//! Shards served in this process, for callers in the same process: the control plane of
//! `chronoshard dev` reaches the shards of its own nodes through a channel instead of a NATS
//! request to itself (a create crossed nats-server twice and was serialised four times).
//!
//! A shard registers under its epoch when it starts answering requests and leaves when it
//! stops; the newest epoch wins, so while a shard moves between two nodes of this process a
//! caller reaches the new owner. A call the shard did not take before it stopped is answered
//! `None`: nothing of it was applied. A shard that is not registered here is reached over NATS as
//! before. The protocol on the shard's request subject is unchanged: this is a shortcut to the
//! same handler, not a second protocol. It owns only the map; it decides nothing.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use chronoshard_wire::rpc::{ShardReply, ShardRequest};
use tokio::sync::{mpsc, oneshot};

/// A request to a local shard and where its reply goes: `None` when the shard stopped without
/// taking it.
pub type LocalCall = (ShardRequest, oneshot::Sender<Option<ShardReply>>);

/// Requests a local shard may have queued before callers wait (NATS buffers similarly).
const QUEUE: usize = 1024;

/// Each shard served here: its epoch and where its calls go.
type Served = HashMap<u32, (u64, mpsc::Sender<LocalCall>)>;

/// The shards served in this process. Cloning shares it; a default one is empty and private.
#[derive(Clone, Default)]
pub struct LocalShards(Arc<Mutex<Served>>);

impl std::fmt::Debug for LocalShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shards: Vec<u32> = self.lock().keys().copied().collect();
        shards.sort_unstable();
        f.debug_tuple("LocalShards").field(&shards).finish()
    }
}

/// A shard's place in `LocalShards`; dropping it leaves (unless another registration of the
/// shard took the place since).
pub struct Registration {
    shards: LocalShards,
    shard: u32,
    calls: mpsc::Sender<LocalCall>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.shards.lock();
        if map
            .get(&self.shard)
            .is_some_and(|(_, tx)| tx.same_channel(&self.calls))
        {
            map.remove(&self.shard);
        }
    }
}

impl LocalShards {
    fn lock(&self) -> std::sync::MutexGuard<'_, Served> {
        // The map is only ever replaced entry by entry: a panic elsewhere cannot leave it torn.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `shard` under `epoch` here: calls arrive on the receiver until the registration
    /// is dropped. `None` when a newer epoch of the shard is registered already.
    pub fn serve(
        &self,
        shard: u32,
        epoch: u64,
    ) -> Option<(Registration, mpsc::Receiver<LocalCall>)> {
        let mut map = self.lock();
        if map.get(&shard).is_some_and(|(e, _)| *e > epoch) {
            return None;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        map.insert(shard, (epoch, tx.clone()));
        let registration = Registration {
            shards: self.clone(),
            shard,
            calls: tx,
        };
        Some((registration, rx))
    }

    /// Where to send a call to `shard`, when this process serves it.
    pub fn get(&self, shard: u32) -> Option<mpsc::Sender<LocalCall>> {
        self.lock().get(&shard).map(|(_, tx)| tx.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_epoch_serves_and_an_older_one_leaving_does_not_remove_it() {
        let local = LocalShards::default();
        assert!(local.get(3).is_none());
        let (old, mut old_rx) = local.serve(3, 1).unwrap();
        let (new, mut new_rx) = local.serve(3, 2).unwrap();
        assert!(
            local.serve(3, 1).is_none(),
            "an older epoch cannot take the place back"
        );
        let (tx, _) = oneshot::channel();
        local
            .get(3)
            .unwrap()
            .try_send((ShardRequest::Ping, tx))
            .unwrap();
        assert!(new_rx.try_recv().is_ok(), "the call reached epoch 2");
        assert!(old_rx.try_recv().is_err());
        drop(old);
        assert!(local.get(3).is_some(), "epoch 1 leaving keeps epoch 2");
        drop(new);
        assert!(local.get(3).is_none());
        // The same epoch registered again: the first registration leaving keeps the second.
        let (first, _) = local.serve(4, 1).unwrap();
        let (_second, _) = local.serve(4, 1).unwrap();
        drop(first);
        assert!(local.get(4).is_some());
    }

    #[test]
    fn shards_are_independent_and_clones_share_the_map() {
        let local = LocalShards::default();
        let other = local.clone();
        let (_a, _) = local.serve(0, 1).unwrap();
        let (b, _) = other.serve(1, 1).unwrap();
        assert_eq!(format!("{local:?}"), "LocalShards([0, 1])");
        drop(b);
        assert!(local.get(0).is_some() && local.get(1).is_none());
        assert!(
            LocalShards::default().get(0).is_none(),
            "a new map is separate"
        );
    }
}
