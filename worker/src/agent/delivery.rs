//! The attempts this worker is running, each with the delivery it answers to. When JetStream
//! hands out an attempt again while it still runs here (its progress acks came late), the new
//! delivery takes the old one's place for acks instead of being run a second time. Each running
//! attempt also has the token that stops its handler, so a shard's cancel reaches it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use async_nats::jetstream::Message;
use chronoshard_wire::Ticket;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The delivery a running attempt acknowledges: the newest one JetStream made. Shared, not
/// copied: a message clone copies its headers, and an attempt acks several times.
#[derive(Clone)]
pub struct Delivery(Arc<Mutex<Arc<Message>>>);

impl Delivery {
    pub fn current(&self) -> Arc<Message> {
        self.0.lock().expect("delivery lock").clone()
    }

    pub fn delivered(&self) -> i64 {
        self.current().info().map(|i| i.delivered).unwrap_or(1)
    }
}

/// Attempts running in this process, each with its delivery and the token that stops it.
/// Cloning shares it.
#[derive(Clone, Default)]
pub struct Running(Arc<Mutex<ByAttempt>>);

/// (ticket, attempt) → its delivery and the token that stops its handler.
type ByAttempt = HashMap<(Uuid, u32), (Delivery, CancellationToken)>;

/// A claimed attempt; dropping it says the attempt no longer runs here.
pub struct Claim {
    running: Running,
    key: (Uuid, u32),
    pub delivery: Delivery,
    /// Fired when a shard cancels the attempt (it was replaced).
    pub cancelled: CancellationToken,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.running
            .0
            .lock()
            .expect("running lock")
            .remove(&self.key);
    }
}

impl Running {
    /// Claims the attempt for this delivery; `None` when it already runs here, which now
    /// answers to this delivery.
    pub fn claim(&self, t: &Ticket, msg: &Arc<Message>) -> Option<Claim> {
        let key = (t.ticket_id, t.attempt);
        let mut map = self.0.lock().expect("running lock");
        if let Some((d, _)) = map.get(&key) {
            *d.0.lock().expect("delivery lock") = msg.clone();
            return None;
        }
        let delivery = Delivery(Arc::new(Mutex::new(msg.clone())));
        let cancelled = CancellationToken::new();
        map.insert(key, (delivery.clone(), cancelled.clone()));
        Some(Claim {
            running: self.clone(),
            key,
            delivery,
            cancelled,
        })
    }

    /// Whether the attempt runs here.
    pub fn contains(&self, ticket: Uuid, attempt: u32) -> bool {
        let map = self.0.lock().expect("running lock");
        map.contains_key(&(ticket, attempt))
    }

    /// Tells the attempt's handler to stop; false when it does not run here.
    pub fn cancel(&self, ticket: Uuid, attempt: u32) -> bool {
        let map = self.0.lock().expect("running lock");
        match map.get(&(ticket, attempt)) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}
