use std::{
    collections::HashMap,
    sync::{atomic::AtomicU64, Arc},
    time::{Duration, SystemTime},
};

use proptest::prelude::*;

use super::*;

fn id(n: u8) -> Uuid {
    Uuid::from_u128(n as u128 + 1)
}

fn agenda() -> Agenda {
    let gauge = prometheus::IntGauge::new("test_agenda_wheel_entries", "test").unwrap();
    Agenda::new(Timers::new(0, 0, Arc::new(AtomicU64::new(0)), gauge))
}

fn due(job: u8, at: i64, priority: u8) -> Due {
    Due {
        job: id(job),
        at,
        priority,
        tenant: job as u32,
    }
}

fn stamp(n: u64) -> Option<WalStamp> {
    Some((n, SystemTime::UNIX_EPOCH + Duration::from_secs(n)))
}

#[test]
fn a_load_asks_the_database_unless_nothing_was_committed_and_nothing_new_falls_due() {
    let mut a = agenda();
    // PostgreSQL has no WAL stamp: every load asks.
    assert!(a.start_load(0, None, 100));
    a.loaded(100, None, Some(150), [], 0);
    assert!(a.start_load(0, None, 120));

    a.loaded(100, stamp(1), Some(500), [], 0);
    assert!(
        !a.start_load(10, stamp(1), 200),
        "unchanged WAL, next beyond 200"
    );
    assert_eq!(
        a.timers.loaded_until(),
        Some(200),
        "the watermark moved anyway"
    );
    assert!(
        a.start_load(20, stamp(1), 500),
        "the next occurrence beyond is reached"
    );
    assert!(a.start_load(20, stamp(2), 300), "something was committed");
}

#[test]
fn a_load_tracks_what_it_found_within_the_new_watermark() {
    let mut a = agenda();
    a.loaded(1_000, stamp(1), None, [due(1, 400, 0), due(2, 900, 0)], 0);
    assert_eq!(a.timers.next_deadline(), Some(400));
    assert!(a.take_due(1_000, |_| false).is_empty());
    let fired: Vec<Uuid> = a.next_batch(10, |_| false).iter().map(|d| d.job).collect();
    assert_eq!(fired, [id(1), id(2)]);
}

#[test]
fn held_back_entries_are_dropped_and_the_rest_come_out_by_priority() {
    let mut a = agenda();
    a.timers.loaded(1_000);
    a.track(due(1, 100, 1), 0);
    a.track(due(2, 100, 5), 0);
    a.track(due(3, 100, 9), 0);
    let retry = Timer::Retry {
        ticket: id(4),
        attempt: 2,
    };
    let held_retry = Timer::Retry {
        ticket: id(5),
        attempt: 2,
    };
    a.timers.arm(100, retry);
    a.timers.arm(100, held_retry);

    // Job 3 and ticket 5 belong to a tenant that moved away before they fell due.
    let others = a.take_due(100, |id_| id_ == id(3) || id_ == id(5));
    assert_eq!(others, [retry]);
    assert!(a.has_backlog());
    // Job 2's tenant froze after its occurrence was taken from the wheel.
    let batch = a.next_batch(10, |id_| id_ == id(2));
    assert_eq!(batch, [due(1, 100, 1)]);
    assert!(!a.has_backlog());
}

#[test]
fn a_full_batch_leaves_the_rest_of_a_storm_in_the_backlog() {
    let mut a = agenda();
    a.timers.loaded(1_000);
    for j in 0..10 {
        a.track(due(j, 50, j % 3), 0);
    }
    a.take_due(50, |_| false);
    let first = a.next_batch(4, |_| false);
    let priorities: Vec<u8> = first.iter().map(|d| d.priority).collect();
    assert_eq!(priorities, [2, 2, 2, 1], "highest priority first");
    let rest = a.next_batch(100, |_| false);
    assert_eq!(rest.len(), 6);
    assert!(!a.has_backlog());
}

#[test]
fn pausing_is_remembered_per_tenant() {
    let mut a = agenda();
    a.paused_are(vec!["a".into(), "b".into()]);
    a.set_paused("b", false);
    a.set_paused("c", true);
    assert!(a.is_paused("a") && !a.is_paused("b") && a.is_paused("c"));
}

#[test]
fn freezing_takes_the_picked_jobs_out_of_the_wheel() {
    let mut a = agenda();
    a.timers.loaded(1_000);
    for j in 0..5 {
        a.track(due(j, 200, 0), 0);
    }
    assert_eq!(
        a.untrack_where(|j| j == id(1) || j == id(3) || j == id(9)),
        2
    );
    a.take_due(1_000, |_| false);
    let left: Vec<Uuid> = a.next_batch(10, |_| false).iter().map(|d| d.job).collect();
    assert_eq!(left.len(), 3);
    assert!(!left.contains(&id(1)) && !left.contains(&id(3)));
}

#[derive(Clone, Debug)]
enum Op {
    /// Job `0` had a ticket fired ahead, due at `1`.
    Fire(u8, i64),
    /// Time moves on by this much and a load starts.
    Load(i64),
    /// A pause or delete of job `0` takes its tickets back.
    TakeJob(u8),
    /// A pause of tenant `0` takes its jobs' tickets back.
    TakeTenant(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0i64..1_000).prop_map(|(j, at)| Op::Fire(j, at)),
        2 => (0i64..200).prop_map(Op::Load),
        1 => (0u8..6).prop_map(Op::TakeJob),
        1 => (0u8..3).prop_map(Op::TakeTenant),
    ]
}

/// Job j belongs to tenant j % 3.
fn tenant(job: u8) -> String {
    format!("t{}", job % 3)
}

proptest! {
    /// Against a model: a job is fired ahead while one of its tickets is not due yet; a load
    /// forgets the due ones; taking by job or tenant returns exactly their tickets, once.
    #[test]
    fn tickets_fired_ahead_are_kept_until_due_and_taken_back_once(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut a = agenda();
        let mut model: HashMap<u8, Vec<(Uuid, i64)>> = HashMap::new();
        let (mut now, mut seq) = (0i64, 100u128);
        for op in ops {
            match op {
                Op::Fire(j, at) => {
                    seq += 1;
                    let ticket = (Uuid::from_u128(seq), now + at);
                    a.note_fired_ahead(id(j), &tenant(j), vec![ticket]);
                    model.entry(j).or_default().push(ticket);
                }
                Op::Load(by) => {
                    now += by;
                    a.start_load(now, None, now);
                    for t in model.values_mut() {
                        t.retain(|(_, at)| *at > now);
                    }
                    model.retain(|_, t| !t.is_empty());
                }
                Op::TakeJob(j) => {
                    let mut got = a.take_fired_ahead(|job, _| job == id(j));
                    let mut want = model.remove(&j).unwrap_or_default();
                    got.sort();
                    want.sort();
                    prop_assert_eq!(got, want);
                }
                Op::TakeTenant(t) => {
                    let name = format!("t{t}");
                    let mut got = a.take_fired_ahead(|_, tenant| tenant == name);
                    let mut want: Vec<(Uuid, i64)> = Vec::new();
                    model.retain(|j, tickets| {
                        let take = tenant(*j) == name;
                        if take {
                            want.extend(tickets.iter().copied());
                        }
                        !take
                    });
                    got.sort();
                    want.sort();
                    prop_assert_eq!(got, want);
                }
            }
            for j in 0..6u8 {
                let expected = model.get(&j).is_some_and(|t| t.iter().any(|(_, at)| *at > now));
                prop_assert_eq!(a.fired_ahead(id(j), now), expected);
            }
        }
    }
}

/// In a `time_window` cluster that grew, a job whose next occurrence the newer layout places on
/// another shard is marked to leave and stays in the wheel until it has; one whose occurrence
/// stays, is beyond what is loaded, or is untracked, is not marked; jobs that could not leave
/// are asked again a little later, those asked longest ago first.
#[test]
fn a_job_placed_elsewhere_by_a_newer_layout_leaves_and_fires_here_until_it_has() {
    use chronoshard_wire::rpc::{Layout, Windows};
    let windows = Windows {
        window_secs: 1,
        layouts: vec![
            Layout {
                from_window: 0,
                shards: 1,
            },
            Layout {
                from_window: 10,
                shards: 4,
            },
        ],
    };
    let mut a = agenda();
    a.loaded(20_000, None, None, [], 0);
    a.place_by(Some(WindowPlacement::new(&windows)), 0, 7);
    assert!(a.places() && a.placed_version() == 7);
    let placement = WindowPlacement::new(&windows);
    // Keys the 4-shard layout puts elsewhere and here.
    let key_of = |n: u8| chronoshard_wire::ids::routing_key(id(n));
    let away = (0..=255u8)
        .find(|n| placement.shard_of(key_of(*n), 10_000) != 0)
        .unwrap();
    let home = (0..=255u8)
        .find(|n| placement.shard_of(key_of(*n), 10_000) == 0)
        .unwrap();
    let wheel = |a: &Agenda| {
        let mut jobs: Vec<Uuid> = a.timers.tracked().copied().collect();
        jobs.sort();
        jobs
    };

    a.track(due(away, 9_000, 5), 0);
    a.track(due(home, 10_000, 5), 0);
    assert!(
        !a.hand_off_due(0),
        "before the edge every occurrence is this shard's"
    );
    // Beyond what is loaded, nothing is decided yet.
    a.track(due(away, 30_000, 5), 0);
    assert!(a.leaving(10).is_empty());

    a.track(due(away, 10_000, 5), 0);
    let target = placement.shard_of(key_of(away), 10_000);
    assert_eq!(
        a.leaving(10),
        vec![Leave {
            job: id(away),
            target
        }]
    );
    assert_eq!(wheel(&a).len(), 2, "it fires here until it has left");
    assert!(a.hand_off_due(i64::MIN + 1));
    // It could not leave (a run in progress): asked again later, or when runs end.
    a.handed_off([], 500);
    assert!(!a.hand_off_due(599) && a.hand_off_due(600));
    assert_eq!(a.next_hand_off(), Some(600));
    a.handed_off([], 500);
    a.runs_ended();
    assert!(a.hand_off_due(500));
    // Jobs not to hand off at all (gone, no longer active, a paused tenant) stay in the wheel.
    a.stay([id(away)]);
    assert!(a.leaving(10).is_empty() && wheel(&a).len() == 2);
    a.track(due(away, 10_000, 5), 0);
    // Tracked again before the edge (a change moved its schedule back), it stays.
    a.track(due(away, 9_500, 5), 0);
    assert!(a.leaving(10).is_empty() && a.next_hand_off().is_none());
    // Once it has left, it is out of the wheel and nothing is left to hand off.
    a.track(due(away, 11_000, 5), 0);
    a.handed_off([id(away)], 700);
    assert_eq!(wheel(&a), vec![id(home)]);
    assert!(a.leaving(10).is_empty() && !a.hand_off_due(i64::MAX));
    // Outside a time_window cluster every job is tracked.
    a.place_by(None, 0, 8);
    a.track(due(away, 11_000, 5), 0);
    assert!(a.leaving(10).is_empty() && !a.places());
}

/// Jobs that cannot leave yet do not keep the others from being asked: each call asks those
/// asked longest ago first.
#[test]
fn jobs_waiting_to_leave_are_asked_in_turn() {
    use chronoshard_wire::rpc::{Layout, Windows};
    let windows = Windows {
        window_secs: 1,
        layouts: vec![Layout {
            from_window: 0,
            shards: 64,
        }],
    };
    let mut a = agenda();
    a.loaded(20_000, None, None, [], 0);
    a.place_by(Some(WindowPlacement::new(&windows)), 63, 1);
    let placement = WindowPlacement::new(&windows);
    let away: Vec<u8> = (0..=255u8)
        .filter(|n| placement.shard_of(chronoshard_wire::ids::routing_key(id(*n)), 1_000) != 63)
        .take(6)
        .collect();
    for n in &away {
        a.track(due(*n, 1_000, 5), 0);
    }
    let first: Vec<Uuid> = a.leaving(3).iter().map(|l| l.job).collect();
    let second: Vec<Uuid> = a.leaving(3).iter().map(|l| l.job).collect();
    let mut all: Vec<Uuid> = first.iter().chain(&second).copied().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 6, "{first:?} then {second:?}");
}
