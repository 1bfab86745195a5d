//! The run's clock and its live counters: every probe counts here, and one task prints the
//! progress line from them once a second. Counting only; nothing here decides or measures.

use std::{
    io::Write,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

/// Wall-clock microseconds since the Unix epoch. Probes in other processes (the no-op workers)
/// stamp events with the same clock, so every time in a run is comparable.
pub fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

pub fn us_of(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// Counters the progress line shows.
#[derive(Debug, Default)]
pub struct Counters {
    pub created: AtomicU64,
    pub create_failed: AtomicU64,
    pub fired: AtomicU64,
    pub started: AtomicU64,
    pub completed: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Prints `[t] phase: created … fired … started … completed …` to stderr every second until
/// `stop`, with per-second rates. `phase` is read each time, so the runner can rename it.
pub fn spawn_progress(
    counters: Arc<Counters>,
    phase: Arc<std::sync::Mutex<String>>,
    start_us: i64,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last = [0u64; 4];
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = [
                Counters::get(&counters.created),
                Counters::get(&counters.fired),
                Counters::get(&counters.started),
                Counters::get(&counters.completed),
            ];
            let rate = |i: usize| now[i].saturating_sub(last[i]);
            let phase = phase.lock().map(|p| p.clone()).unwrap_or_default();
            let failed = Counters::get(&counters.create_failed);
            let failed = if failed > 0 {
                format!(" ({failed} failed)")
            } else {
                String::new()
            };
            let _ = writeln!(
                std::io::stderr(),
                "[{:>6.1}s] {phase}: created {}{failed} (+{}/s) · fired {} (+{}/s) · started {} (+{}/s) · completed {} (+{}/s)",
                (now_us() - start_us) as f64 / 1e6,
                now[0],
                rate(0),
                now[1],
                rate(1),
                now[2],
                rate(2),
                now[3],
                rate(3),
            );
            last = now;
        }
    })
}
