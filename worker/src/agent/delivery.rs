//! The attempts this worker is running, each with the delivery it answers to. When JetStream
//! hands out an attempt again while it still runs here (its progress acks came late), the new
//! delivery takes the old one's place for acks instead of being run a second time.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use async_nats::jetstream::Message;
use chronoshard_wire::Ticket;
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

/// Attempts running in this process. Cloning shares it.
#[derive(Clone, Default)]
pub struct Running(Arc<Mutex<HashMap<(Uuid, u32), Delivery>>>);

/// A claimed attempt; dropping it says the attempt no longer runs here.
pub struct Claim {
    running: Running,
    key: (Uuid, u32),
    pub delivery: Delivery,
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
        if let Some(d) = map.get(&key) {
            *d.0.lock().expect("delivery lock") = msg.clone();
            return None;
        }
        let delivery = Delivery(Arc::new(Mutex::new(msg.clone())));
        map.insert(key, delivery.clone());
        Some(Claim {
            running: self.clone(),
            key,
            delivery,
        })
    }
}
