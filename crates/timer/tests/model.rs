//! Property tests of the public API against a reference model: a `BTreeMap<(deadline, seq), T>`
//! where `seq` is the insertion number, so iteration order is exactly the promised firing order.
//! Every step compares outputs, `cancel` results, `len`, `now` and `next_deadline`.

use std::collections::{BTreeMap, HashMap};

use chronoshard_timer::{TimerKey, TimerWheel};
use proptest::prelude::*;

const NOW: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const HORIZON: u64 = 300_000; // 5 minutes
const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;

#[derive(Default)]
struct Model {
    now: u64,
    seq: u64,
    pending: BTreeMap<(u64, u64), u64>,
    keys: HashMap<TimerKey, (u64, u64)>,
}

impl Model {
    fn insert(&mut self, key: TimerKey, deadline: u64, item: u64) {
        self.seq += 1;
        self.pending.insert((deadline, self.seq), item);
        assert!(
            self.keys.insert(key, (deadline, self.seq)).is_none(),
            "key reused"
        );
    }

    fn cancel(&mut self, key: TimerKey) -> Option<u64> {
        let at = self.keys.get(&key)?;
        self.pending.remove(at)
    }

    fn advance(&mut self, now: u64) -> Vec<(u64, u64)> {
        self.now = self.now.max(now);
        let mut out = Vec::new();
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let ((deadline, _), item) = entry.remove_entry();
            out.push((deadline, item));
        }
        out
    }
}

/// Where a deadline falls relative to the wheel's current time.
#[derive(Debug, Clone)]
enum When {
    Past(u64),
    Near(u64),
    Horizon(u64),
    Far(u64),
    Absolute(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Insert(When),
    /// Cancel the n-th key ever issued (modulo count): may be live, fired or cancelled.
    Cancel(usize),
    /// Advance by a small step, a big step, or to an absolute time (possibly in the past).
    Step(u64),
    Jump(u64),
    AdvanceTo(u64),
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        1 => (0u64..5_000).prop_map(When::Past),
        4 => (0u64..200).prop_map(When::Near),
        4 => (0u64..=HORIZON).prop_map(When::Horizon),
        1 => (0u64..20 * YEAR_MS).prop_map(When::Far),
        1 => any::<u64>().prop_map(When::Absolute),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => when().prop_map(Op::Insert),
        2 => any::<usize>().prop_map(Op::Cancel),
        3 => (0u64..150).prop_map(Op::Step),
        1 => (0u64..2 * HORIZON).prop_map(Op::Jump),
        1 => (0u64..3 * YEAR_MS).prop_map(|d| Op::AdvanceTo(NOW - 1000 + d)),
    ]
}

fn deadline(now: u64, w: &When) -> u64 {
    match *w {
        When::Past(d) => now.saturating_sub(d),
        When::Near(d) | When::Horizon(d) | When::Far(d) => now.saturating_add(d),
        When::Absolute(d) => d,
    }
}

fn run(ops: &[Op], same_ms_bursts: bool) -> Result<(), TestCaseError> {
    let mut wheel = TimerWheel::with_capacity(NOW, 16);
    let mut model = Model {
        now: NOW,
        ..Model::default()
    };
    let mut issued: Vec<TimerKey> = Vec::new();
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Insert(w) => {
                let d = deadline(wheel.now(), w);
                // Bursts of identical deadlines exercise the tie order.
                let copies = if same_ms_bursts { 1 + i % 3 } else { 1 };
                for c in 0..copies {
                    let item = (i * 4 + c) as u64;
                    let key = wheel.insert(d, item);
                    model.insert(key, d, item);
                    issued.push(key);
                }
            }
            Op::Cancel(n) if !issued.is_empty() => {
                let key = issued[n % issued.len()];
                prop_assert_eq!(wheel.cancel(key), model.cancel(key).is_some());
            }
            Op::Cancel(_) => {}
            Op::Step(dt) | Op::Jump(dt) => {
                let t = wheel.now().saturating_add(*dt);
                out.clear();
                wheel.advance(t, &mut out);
                prop_assert_eq!(&out, &model.advance(t));
            }
            Op::AdvanceTo(t) => {
                out.clear();
                wheel.advance(*t, &mut out);
                prop_assert_eq!(&out, &model.advance(*t));
            }
        }
        prop_assert_eq!(wheel.len(), model.pending.len());
        prop_assert_eq!(wheel.is_empty(), model.pending.is_empty());
        prop_assert_eq!(wheel.now(), model.now);
        prop_assert_eq!(
            wheel.next_deadline(),
            model.pending.keys().next().map(|k| k.0)
        );
    }
    // Finally drain everything, including deadlines at the end of time.
    out.clear();
    wheel.advance(u64::MAX, &mut out);
    prop_assert_eq!(&out, &model.advance(u64::MAX));
    prop_assert!(wheel.is_empty());
    for key in issued {
        prop_assert!(!wheel.cancel(key));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn matches_model(ops in prop::collection::vec(op(), 1..400)) {
        run(&ops, false)?;
    }

    #[test]
    fn matches_model_with_same_ms_bursts(ops in prop::collection::vec(op(), 1..400)) {
        run(&ops, true)?;
    }

    /// Walking time 1 ms at a time and in one jump must give the same sequence.
    #[test]
    fn one_ms_steps_equal_one_jump(
        deadlines in prop::collection::vec(0u64..20_000, 1..300),
        cancel_every in 2usize..10,
    ) {
        let mut stepped = TimerWheel::new(NOW);
        let mut jumped = TimerWheel::new(NOW);
        for (i, d) in deadlines.iter().enumerate() {
            let (a, b) = (stepped.insert(NOW + d, i), jumped.insert(NOW + d, i));
            if i % cancel_every == 0 {
                prop_assert!(stepped.cancel(a));
                prop_assert!(jumped.cancel(b));
            }
        }
        let (mut out_s, mut out_j) = (Vec::new(), Vec::new());
        for t in NOW..=NOW + 20_000 {
            stepped.advance(t, &mut out_s);
        }
        jumped.advance(NOW + 20_000, &mut out_j);
        prop_assert_eq!(out_s, out_j);
    }
}
