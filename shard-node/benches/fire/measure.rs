//! What the fire bench measures with, apart from the node: the subscriber that timestamps every
//! ticket on its own thread, the node's fire counter, and percentiles.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use chrono::Utc;
use chronoshard_wire::names;
use futures::StreamExt;

use super::Res;

pub(crate) struct Collected {
    /// (receive time in µs since the epoch, payload), in arrival order.
    pub messages: Vec<(i64, Bytes)>,
    pub slow_consumer: u64,
}

/// Subscribes to every dispatch subject on its own connection and current-thread runtime (so
/// the node's tasks cannot delay a receipt timestamp), signals `ready` once the subscription is
/// registered at the server, then records messages until `expected` arrived and nothing more
/// arrives for 500 ms, or nothing arrives for `timeout` after `last_due` and the last message.
pub(crate) fn collect(
    url: String,
    expected: usize,
    last_due: Instant,
    timeout: Duration,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Res<Collected> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let slow = Arc::new(AtomicU64::new(0));
        let slow_cb = slow.clone();
        let client = async_nats::ConnectOptions::new()
            .subscription_capacity(1 << 20)
            .event_callback(move |e| {
                let slow = slow_cb.clone();
                async move {
                    if let async_nats::Event::SlowConsumer(_) = e {
                        slow.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .connect(url)
            .await?;
        let mut sub = client.subscribe(names::DISPATCH_SUBJECTS).await?;
        client.flush().await?;
        let _ = ready.send(());
        let mut messages = Vec::with_capacity(expected);
        let mut last = last_due;
        loop {
            // Once every ticket is in, wait briefly for repeats, then stop.
            let wait = if messages.len() >= expected {
                Duration::from_millis(500)
            } else {
                (last.max(last_due) + timeout).saturating_duration_since(Instant::now())
            };
            match tokio::time::timeout(wait, sub.next()).await {
                Ok(Some(m)) => {
                    messages.push((Utc::now().timestamp_micros(), m.payload));
                    last = Instant::now();
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(Collected {
            messages,
            slow_consumer: slow.load(Ordering::Relaxed),
        })
    })
}

/// Tickets per second between the polls where 10% and 90% of `n` were first in the stream.
pub(crate) fn steady_rate(samples: &[(i64, u64)], n: u64) -> Option<f64> {
    let at = |frac: f64| samples.iter().find(|(_, m)| *m as f64 >= frac * n as f64);
    let (t1, m1) = at(0.1)?;
    let (t2, m2) = at(0.9)?;
    (t2 > t1).then(|| (m2 - m1) as f64 / ((t2 - t1) as f64 / 1000.0))
}
