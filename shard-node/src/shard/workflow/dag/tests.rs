use chronoshard_wire::{RetrySpec, StepSpec, TargetSpec};
use proptest::prelude::*;

use super::*;

fn def(edges: &[Vec<usize>], fail_fast: bool) -> WorkflowDef {
    WorkflowDef {
        steps: edges
            .iter()
            .enumerate()
            .map(|(i, ps)| StepSpec {
                name: format!("s{i}"),
                target: TargetSpec::Shell {
                    command: "true".into(),
                    args: vec![],
                },
                payload: serde_json::Value::Null,
                retry: RetrySpec::default(),
                timeout: chronoshard_wire::Dur(std::time::Duration::from_secs(1)),
                after: ps.iter().map(|p| format!("s{p}")).collect(),
            })
            .collect(),
        fail_fast,
    }
}

/// The status each step has when its run starts: roots dispatched, the others waiting.
fn start(edges: &[Vec<usize>]) -> Vec<RunStatus> {
    edges
        .iter()
        .map(|ps| {
            if ps.is_empty() {
                RunStatus::Dispatched
            } else {
                RunStatus::Waiting
            }
        })
        .collect()
}

/// Applies actions as the shard would, checking that each acts on a step in the right state.
fn apply(status: &mut [RunStatus], actions: &[Action]) {
    for a in actions {
        match a {
            Action::Release { item, .. } => {
                assert_eq!(status[*item], RunStatus::Waiting, "{a:?}");
                status[*item] = RunStatus::Dispatched;
            }
            Action::Skip { item, .. } => {
                assert_eq!(status[*item], RunStatus::Waiting, "{a:?}");
                status[*item] = RunStatus::Skipped;
            }
            Action::Cancel { item } => {
                assert!(in_progress(status[*item]), "{a:?}");
                status[*item] = RunStatus::Cancelled;
            }
        }
    }
}

fn etl() -> Vec<Vec<usize>> {
    // extract, validate, clean(extract, validate), transform(clean), load(transform),
    // report(load), archive(load)
    vec![
        vec![],
        vec![],
        vec![0, 1],
        vec![2],
        vec![3],
        vec![4],
        vec![4],
    ]
}

#[test]
fn a_step_waits_for_all_it_depends_on_and_gets_their_outputs() {
    let d = def(&etl(), false);
    let mut s = start(&etl());
    let mut out = vec![None; 7];
    s[0] = RunStatus::Succeeded;
    out[0] = Some("{\"rows\": 10}".to_string());
    assert!(advance(&d, &s, &out).is_empty(), "clean waits for validate");
    s[1] = RunStatus::Succeeded;
    out[1] = Some("ok".to_string());
    let a = advance(&d, &s, &out);
    assert_eq!(
        a,
        vec![Action::Release {
            item: 2,
            upstream: [
                ("s0".to_string(), Some("{\"rows\": 10}".to_string())),
                ("s1".to_string(), Some("ok".to_string()))
            ]
            .into()
        }]
    );
    apply(&mut s, &a);
    assert!(advance(&d, &s, &out).is_empty(), "nothing twice");
}

#[test]
fn a_dead_step_skips_what_follows_it_and_names_itself() {
    let d = def(&etl(), false);
    let mut s = start(&etl());
    s[0] = RunStatus::Succeeded;
    s[1] = RunStatus::Succeeded;
    s[2] = RunStatus::Succeeded;
    s[3] = RunStatus::Dead;
    let a = advance(&d, &s, &vec![None; 7]);
    let skipped: Vec<(usize, String)> = a
        .iter()
        .map(|x| match x {
            Action::Skip { item, reason } => (*item, reason.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        skipped.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
    for (_, r) in skipped {
        assert_eq!(r, "upstream step \"s3\" ended dead");
    }
}

#[test]
fn independent_branches_finish_unless_the_run_fails_fast() {
    // a → b; c → d (two branches)
    let edges = vec![vec![], vec![0], vec![], vec![2]];
    let mut s = start(&edges);
    s[0] = RunStatus::Dead;
    let a = advance(&def(&edges, false), &s, &vec![None; 4]);
    assert_eq!(a.len(), 1, "only b is skipped: {a:?}");
    let a = advance(&def(&edges, true), &s, &vec![None; 4]);
    assert!(a.contains(&Action::Cancel { item: 2 }), "{a:?}");
    assert!(
        a.iter().any(
            |x| matches!(x, Action::Skip { item: 3, reason } if reason.contains("failed fast"))
        ),
        "{a:?}"
    );
}

#[test]
fn outputs_are_cut_at_a_character_boundary() {
    let long = "é".repeat(MAX_STEP_OUTPUT_BYTES);
    let c = cut(&long);
    assert!(c.len() <= MAX_STEP_OUTPUT_BYTES && c.len() >= MAX_STEP_OUTPUT_BYTES - 1);
    assert_eq!(cut("short"), "short");
}

fn acyclic() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (1usize..25).prop_flat_map(|n| {
        (0..n)
            .map(|i| proptest::sample::subsequence((0..i).collect::<Vec<_>>(), 0..=i.min(3)))
            .collect::<Vec<_>>()
    })
}

proptest! {
    /// Runs a workflow to its end with random step outcomes, executing dispatched steps in a
    /// random order, and checks the rules: a step runs only after everything it waits for
    /// succeeded, at most once; a step is skipped exactly when something it depends on
    /// (directly or not) ended dead; nothing is left waiting.
    #[test]
    fn a_run_ends_with_every_step_run_once_or_skipped_for_a_reason(
        edges in acyclic(),
        dies in proptest::collection::vec(prop::bool::weighted(0.2), 25),
        order in proptest::collection::vec(any::<u16>(), 50),
    ) {
        let d = def(&edges, false);
        let n = edges.len();
        let mut s = start(&edges);
        let out = vec![None; n];
        let mut executed = vec![0u32; n];
        let mut k = 0;
        loop {
            let a = advance(&d, &s, &out);
            for x in &a {
                if let Action::Release { item, .. } = x {
                    for &p in &edges[*item] {
                        prop_assert_eq!(s[p], RunStatus::Succeeded);
                    }
                }
                prop_assert!(!matches!(x, Action::Cancel { item: _ }), "{:?}", x);
            }
            apply(&mut s, &a);
            let running: Vec<usize> = (0..n).filter(|&i| s[i] == RunStatus::Dispatched).collect();
            if running.is_empty() {
                break;
            }
            let i = running[order[k % order.len()] as usize % running.len()];
            k += 1;
            executed[i] += 1;
            s[i] = if dies[i] { RunStatus::Dead } else { RunStatus::Succeeded };
        }
        // Ancestors that died, computed independently of `advance`.
        for i in 0..n {
            prop_assert!(s[i] != RunStatus::Waiting);
            let mut stack = edges[i].clone();
            let mut doomed = false;
            let mut seen = vec![false; n];
            while let Some(p) = stack.pop() {
                if std::mem::replace(&mut seen[p], true) {
                    continue;
                }
                doomed |= dies[p];
                stack.extend(edges[p].iter().copied());
            }
            prop_assert_eq!(s[i] == RunStatus::Skipped, doomed, "step {} of {:?}", i, edges);
            prop_assert_eq!(executed[i], u32::from(!doomed));
        }
    }

    /// Whatever the statuses, `advance` acts only on steps in the state its action needs, and
    /// acting on its answer leaves nothing more to do.
    #[test]
    fn advance_is_idempotent(
        edges in acyclic(),
        picks in proptest::collection::vec(0usize..6, 25),
        fail_fast in any::<bool>(),
    ) {
        const ANY: [RunStatus; 6] = [
            RunStatus::Waiting, RunStatus::Dispatched, RunStatus::Running,
            RunStatus::Succeeded, RunStatus::Dead, RunStatus::Skipped,
        ];
        let n = edges.len();
        let mut s: Vec<RunStatus> = (0..n).map(|i| ANY[picks[i]]).collect();
        let d = def(&edges, fail_fast);
        let out = vec![None; n];
        let a = advance(&d, &s, &out);
        apply(&mut s, &a);
        let again = advance(&d, &s, &out);
        prop_assert!(again.iter().all(|x| !matches!(x, Action::Release { .. } | Action::Skip { .. })),
            "{:?}", again);
    }
}
