//! Wake-ups at a precise instant, for the waits whose lateness users see: the dispatcher's release
//! of a ticket at its scheduled millisecond, and the shard loop's next wheel deadline.
//!
//! Why not `tokio::time::sleep`: tokio's timer rounds a deadline up to its next millisecond tick,
//! and its driver parks in `epoll_wait` with a timeout rounded up to a millisecond again, so a
//! tokio sleep ends 0–2 ms after its deadline, about 1 ms on average: that was the whole fire
//! lateness p50 of the fire bench (BENCHMARKS.md, "Precise wake-ups"). Here one thread per process
//! waits on a condition variable (a futex wait with a nanosecond timeout, ended by a
//! high-resolution timer) until the earliest registered deadline, and wakes the tasks that are due.
//!
//! This module owns that thread and its table of deadlines. It runs nothing but wake-ups: a due
//! task is only scheduled on its own runtime, so a slow task cannot delay another's wake-up.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{Condvar, Mutex, MutexGuard, Once},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

/// Registered wake-ups by (deadline, registration number): the first entry is the next one due.
struct Table {
    waiting: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
}

struct Alarm {
    table: Mutex<Table>,
    /// Rung when a deadline earlier than every other one is registered.
    earlier: Condvar,
}

static ALARM: Alarm = Alarm {
    table: Mutex::new(Table {
        waiting: BTreeMap::new(),
        next_id: 0,
    }),
    earlier: Condvar::new(),
};

fn table() -> MutexGuard<'static, Table> {
    // The table holds plain data, consistent between statements: one left by a panicking holder
    // is still usable.
    ALARM.table.lock().unwrap_or_else(|e| e.into_inner())
}

fn start_thread() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        std::thread::Builder::new()
            .name("chronoshard-alarm".into())
            .spawn(ring_forever)
            .expect("the alarm thread starts");
    });
}

fn ring_forever() {
    let mut table = table();
    let mut due = Vec::new();
    loop {
        let now = Instant::now();
        while let Some(entry) = table.waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        if !due.is_empty() {
            // Woken outside the lock: a waker may take time (it schedules a task on a runtime).
            drop(table);
            due.drain(..).for_each(Waker::wake);
            table = self::table();
            continue;
        }
        let next = table.waiting.first_key_value().map(|((at, _), _)| *at);
        table = match next {
            Some(at) => {
                ALARM
                    .earlier
                    .wait_timeout(table, at.saturating_duration_since(now))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => ALARM.earlier.wait(table).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// Completes at `deadline`, within the wake-up latency of a thread (tens of microseconds), not at
/// the next millisecond tick after it. Dropping it cancels the wake-up.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        key: None,
    }
}

/// Completes `wait` from now (see `sleep_until`).
pub fn sleep(wait: Duration) -> Sleep {
    sleep_until(Instant::now() + wait)
}

#[derive(Debug)]
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    deadline: Instant,
    /// Its entry in the table, once registered.
    key: Option<(Instant, u64)>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline {
            this.cancel();
            return Poll::Ready(());
        }
        let mut table = table();
        if let Some(waker) = this.key.and_then(|k| table.waiting.get_mut(&k)) {
            if !waker.will_wake(cx.waker()) {
                waker.clone_from(cx.waker());
            }
            return Poll::Pending;
        }
        // The thread removes an entry only once its deadline passed, so an entry is missing here
        // only before the first poll.
        let key = (this.deadline, table.next_id);
        table.next_id += 1;
        let first = table
            .waiting
            .first_key_value()
            .is_none_or(|(k, _)| key < *k);
        table.waiting.insert(key, cx.waker().clone());
        this.key = Some(key);
        drop(table);
        start_thread();
        if first {
            ALARM.earlier.notify_one();
        }
        Poll::Pending
    }
}

impl Sleep {
    fn cancel(&mut self) {
        if let Some(key) = self.key.take() {
            table().waiting.remove(&key);
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Wake-ups registered and not yet due (tests: dropped sleeps leave nothing behind).
#[cfg(test)]
fn registered() -> usize {
    table().waiting.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is shared by the whole test process: tests that count entries hold this lock.
    static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn ends_at_its_deadline_never_before() {
        let _g = COUNTING.lock().await;
        let start = Instant::now();
        for ms in [0u64, 1, 3, 7] {
            let deadline = start + Duration::from_millis(ms);
            sleep_until(deadline).await;
            assert!(Instant::now() >= deadline, "woke before {ms} ms");
        }
        assert_eq!(registered(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_sleepers_in_any_order_all_wake_once_due() {
        let _g = COUNTING.lock().await;
        let start = Instant::now();
        // Registered latest first: every new one is the earliest and rings the thread.
        let tasks: Vec<_> = (0..200u64)
            .rev()
            .map(|i| {
                let deadline = start + Duration::from_micros(i * 150);
                tokio::spawn(async move {
                    sleep_until(deadline).await;
                    Instant::now() >= deadline
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap(), "a sleeper woke before its deadline");
        }
        assert_eq!(registered(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deadlines_registered_earliest_first_all_wake() {
        let _g = COUNTING.lock().await;
        let start = Instant::now();
        // Each new deadline is later than the one the thread waits for: found when it next wakes.
        let mut tasks = Vec::new();
        for i in 1..=50u64 {
            let deadline = start + Duration::from_micros(i * 200);
            tasks.push(tokio::spawn(async move {
                sleep_until(deadline).await;
                Instant::now() >= deadline
            }));
            tokio::task::yield_now().await;
        }
        for t in tasks {
            assert!(t.await.unwrap(), "a sleeper woke before its deadline");
        }
        assert_eq!(registered(), 0);
    }

    #[tokio::test]
    async fn a_dropped_sleep_leaves_nothing_and_others_still_wake() {
        let _g = COUNTING.lock().await;
        let far = sleep(Duration::from_secs(3600));
        let near = sleep(Duration::from_millis(2));
        tokio::select! {
            _ = far => panic!("an hour passed"),
            _ = near => {}
        }
        // Both futures are dropped by now: the hour-long one took its entry with it.
        assert_eq!(registered(), 0);
    }

    #[tokio::test]
    async fn a_sleep_polled_again_by_another_task_wakes_that_task() {
        let _g = COUNTING.lock().await;
        let mut s = Box::pin(sleep(Duration::from_millis(3)));
        // First poll from this task registers its waker; then another task awaits it.
        assert!(futures::poll!(s.as_mut()).is_pending());
        tokio::spawn(s).await.unwrap();
        assert_eq!(registered(), 0);
    }
}
