//! Knowing when a run is over: ticks owed occurrences off as the watcher reports them fired and
//! done, then waits for the platform to be quiet (the queue's consumer has nothing pending, the
//! results stream is empty), so that a late second delivery or result is still seen. Every wait
//! has a deadline; what is still open at the deadline is the check's business, not this module's.

use std::{collections::HashSet, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    probe::nats::{queue_unfinished, results_unrecorded, Feed},
    progress::{now_us, us_of},
    scenario::Owed,
};

/// How often the conditions are looked at.
const POLL: Duration = Duration::from_millis(10);

/// The owed occurrences not yet fired, and not yet done.
#[derive(Debug)]
pub struct Remaining {
    feed: Arc<Feed>,
    unfired: HashSet<(Uuid, i64)>,
    undone: HashSet<(Uuid, i64)>,
}

impl Remaining {
    pub fn new<'a>(feed: Arc<Feed>, jobs: impl Iterator<Item = (Uuid, &'a Owed)>) -> Remaining {
        let owed: HashSet<(Uuid, i64)> = jobs
            .flat_map(|(job, owed)| owed.instants().into_iter().map(move |t| (job, us_of(t))))
            .collect();
        Remaining {
            feed,
            unfired: owed.clone(),
            undone: owed,
        }
    }

    fn update(&mut self) {
        for o in Feed::take(&self.feed.fired) {
            self.unfired.remove(&o);
        }
        for o in Feed::take(&self.feed.done) {
            self.undone.remove(&o);
        }
    }

    pub fn unfired(&mut self) -> usize {
        self.update();
        self.unfired.len()
    }

    pub fn undone(&mut self) -> usize {
        self.update();
        self.undone.len()
    }
}

/// Waits until every owed occurrence has a ticket, or `deadline`; the count still unfired.
pub async fn until_fired(remaining: &mut Remaining, deadline: DateTime<Utc>) -> usize {
    while remaining.unfired() > 0 && Utc::now() < deadline {
        tokio::time::sleep(POLL).await;
    }
    remaining.unfired()
}

/// How the drain ended.
#[derive(Debug, Default)]
pub struct Drained {
    /// When every owed occurrence had a success and every result was recorded (µs).
    pub recorded_us: Option<i64>,
    /// Owed occurrences without a success at the deadline.
    pub undone: usize,
    /// Why the platform was not quiet at the deadline, if it was not.
    pub not_quiet: Option<String>,
}

/// Waits until every owed occurrence succeeded and the shards recorded every result, then until
/// `queue` (when given) has nothing in flight; all before `deadline`.
pub async fn until_done(
    remaining: &mut Remaining,
    js: &async_nats::jetstream::Context,
    queue: Option<&str>,
    deadline: DateTime<Utc>,
) -> Drained {
    let mut out = Drained::default();
    loop {
        if remaining.undone() == 0 {
            match results_unrecorded(js).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    out.not_quiet = Some(format!("cannot read the results stream: {e}"));
                    return out;
                }
            }
        }
        if Utc::now() > deadline {
            out.undone = remaining.undone();
            return out;
        }
        tokio::time::sleep(POLL).await;
    }
    out.recorded_us = Some(now_us());
    // Deliveries still pending or unacknowledged could bring a second execution: wait them out.
    while let Some(q) = queue {
        match queue_unfinished(js, q).await {
            Ok(0) => break,
            Ok(n) if Utc::now() > deadline => {
                out.not_quiet = Some(format!("{n} deliveries of queue {q} still in flight"));
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                out.not_quiet = Some(format!("cannot read queue {q}: {e}"));
                break;
            }
        }
    }
    out
}
