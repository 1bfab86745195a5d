use proptest::prelude::*;
use serde_json::json;

use super::*;

fn step(name: &str, after: &[&str]) -> StepSpec {
    StepSpec {
        name: name.into(),
        target: TargetSpec::Shell {
            command: "true".into(),
            args: vec![],
        },
        payload: serde_json::Value::Null,
        retry: RetrySpec::default(),
        timeout: crate::job::default_timeout(),
        after: after.iter().map(|s| s.to_string()).collect(),
    }
}

fn def(steps: Vec<StepSpec>) -> WorkflowDef {
    WorkflowDef {
        steps,
        fail_fast: false,
    }
}

fn etl() -> Vec<StepSpec> {
    vec![
        step("extract", &[]),
        step("validate", &[]),
        step("clean", &["extract", "validate"]),
        step("transform", &["clean"]),
        step("load", &["transform"]),
        step("report", &["load"]),
        step("archive", &["load"]),
    ]
}

#[test]
fn the_etl_example_is_valid_and_its_edges_are_indices() {
    let d = def(etl());
    d.validate().unwrap();
    assert_eq!(
        d.predecessors(),
        vec![
            vec![],
            vec![],
            vec![0, 1],
            vec![2],
            vec![3],
            vec![4],
            vec![4]
        ]
    );
}

#[test]
fn unknown_duplicate_and_self_edges_name_the_step() {
    let e = def(vec![step("a", &[]), step("b", &["c"])])
        .validate()
        .unwrap_err();
    assert_eq!(e.field, "steps[1].after");
    assert!(e.message.contains("unknown step \"c\""), "{e}");

    let e = def(vec![step("a", &[]), step("a", &[])])
        .validate()
        .unwrap_err();
    assert_eq!(e.field, "steps[1].name");
    assert!(e.message.contains("duplicate"), "{e}");

    let e = def(vec![step("a", &["a"])]).validate().unwrap_err();
    assert_eq!(e.field, "steps[0].after");

    let e = def(vec![step("a", &[]), step("b", &["a", "a"])])
        .validate()
        .unwrap_err();
    assert!(e.message.contains("twice"), "{e}");

    let e = def(vec![step("bad.name", &[])]).validate().unwrap_err();
    assert_eq!(e.field, "steps[0].name");
}

#[test]
fn a_cycle_is_refused_naming_the_edge_that_closes_it() {
    let mut steps = etl();
    steps[2].after.push("load".into()); // clean also waits for load: clean → transform → load → clean
    let d = def(steps);
    let e = d.validate().unwrap_err();
    assert!(e.message.contains("closes the cycle"), "{e}");
    assert!(
        e.message.contains("clean → transform → load → clean")
            || e.message.contains("transform → load → clean → transform")
            || e.message.contains("load → clean → transform → load"),
        "{e}"
    );
    names_a_real_edge(&d, &e);
}

/// The refusal of a cycle names an `after` entry the workflow has: the field is the waiting
/// step's, and the message says which step it waits for.
fn names_a_real_edge(d: &WorkflowDef, e: &FieldError) {
    let index = e
        .field
        .strip_prefix("steps[")
        .and_then(|f| f.strip_suffix("].after"));
    let i: usize = index
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("field {}", e.field));
    let quoted: Vec<&str> = e.message.split('"').skip(1).step_by(2).collect();
    assert_eq!(quoted[0], d.steps[i].name, "{e}");
    assert!(d.steps[i].after.iter().any(|a| a == quoted[1]), "{e}");
}

#[test]
fn step_fields_are_checked_under_the_steps_path() {
    let mut s = step("a", &[]);
    s.retry.max_attempts = 0;
    assert_eq!(
        def(vec![s]).validate().unwrap_err().field,
        "steps[0].retry.max_attempts"
    );
    let mut s = step("a", &[]);
    s.target = TargetSpec::Http {
        url: "ftp://x".into(),
        method: "POST".into(),
        headers: Default::default(),
    };
    assert_eq!(
        def(vec![s]).validate().unwrap_err().field,
        "steps[0].target.url"
    );
    let mut s = step("a", &[]);
    s.payload = json!([1, 2]);
    assert_eq!(
        def(vec![s]).validate().unwrap_err().field,
        "steps[0].payload"
    );
    let mut b = step("b", &["a"]);
    b.payload = json!({"upstream": 1});
    assert_eq!(
        def(vec![step("a", &[]), b]).validate().unwrap_err().field,
        "steps[1].payload.upstream"
    );
}

#[test]
fn the_number_of_steps_is_limited() {
    assert_eq!(def(vec![]).validate().unwrap_err().field, "steps");
    let many = (0..=MAX_STEPS)
        .map(|i| step(&format!("s{i}"), &[]))
        .collect();
    assert_eq!(def(many).validate().unwrap_err().field, "steps");
}

#[test]
fn a_workflow_round_trips_through_its_job() {
    let spec: WorkflowSpec = serde_json::from_value(json!({
        "tenant": "acme", "name": "nightly-etl", "schedule": {"cron": "0 2 * * *"},
        "fail_fast": true, "overlap": "forbid",
        "steps": [
            {"name": "extract", "target": {"type": "shell", "command": "extract.sh"}},
            {"name": "load", "target": {"type": "http", "url": "https://x/load"},
             "payload": {"table": "t"}, "after": ["extract"]}
        ]
    }))
    .unwrap();
    let job = spec.clone().into_job();
    job.validate().unwrap();
    assert_eq!(job.shard_items, 2);
    let text = serde_json::to_string(&job).unwrap();
    let back: JobSpec = serde_json::from_str(&text).unwrap();
    assert_eq!(WorkflowSpec::of_job(&back), Some(spec));
}

#[test]
fn a_patch_keeps_what_it_does_not_name() {
    let current = def(etl());
    let p = WorkflowPatch {
        fail_fast: Some(true),
        ..Default::default()
    };
    let jp = p.to_job_patch(&current);
    let w = jp.workflow.unwrap();
    assert!(w.fail_fast);
    assert_eq!(w.steps, current.steps);
    assert!(WorkflowPatch::default()
        .to_job_patch(&current)
        .workflow
        .is_none());
}

#[test]
fn upstream_outputs_are_json_when_they_parse() {
    let v = upstream_value(
        [
            ("a".to_string(), Some("{\"rows\": 3}".to_string())),
            ("b".to_string(), Some("plain text".to_string())),
            ("c".to_string(), None),
        ]
        .into(),
    );
    assert_eq!(v, json!({"a": {"rows": 3}, "b": "plain text", "c": null}));
}

/// Steps where each may wait only for steps before it: never a cycle.
fn acyclic() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (1usize..30).prop_flat_map(|n| {
        (0..n)
            .map(|i| proptest::sample::subsequence((0..i).collect::<Vec<_>>(), 0..=i.min(4)))
            .collect::<Vec<_>>()
    })
}

fn build(edges: &[Vec<usize>]) -> WorkflowDef {
    def(edges
        .iter()
        .enumerate()
        .map(|(i, ps)| {
            let after: Vec<String> = ps.iter().map(|p| format!("s{p}")).collect();
            let refs: Vec<&str> = after.iter().map(String::as_str).collect();
            step(&format!("s{i}"), &refs)
        })
        .collect())
}

proptest! {
    #[test]
    fn any_acyclic_graph_is_valid_in_any_order(edges in acyclic(), seed in any::<u64>()) {
        let mut d = build(&edges);
        // The order steps are listed in does not matter.
        let n = d.steps.len();
        d.steps.rotate_left((seed as usize) % n);
        prop_assert!(d.validate().is_ok());
        let preds = d.predecessors();
        let total: usize = preds.iter().map(Vec::len).sum();
        prop_assert_eq!(total, edges.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn a_back_edge_on_a_path_is_always_a_cycle(edges in acyclic(), pick in any::<u64>()) {
        // Add a chain s0 → s1 → … so that any back edge closes a cycle.
        let mut edges = edges;
        for (i, ps) in edges.iter_mut().enumerate().skip(1) {
            if !ps.contains(&(i - 1)) {
                ps.push(i - 1);
            }
        }
        prop_assume!(edges.len() >= 2);
        let to = (pick as usize) % (edges.len() - 1);
        let from = edges.len() - 1;
        // s{to} waits for the last step, which (through the chain) waits for s{to}.
        edges[to].push(from);
        let d = build(&edges);
        let e = d.validate().unwrap_err();
        prop_assert!(e.message.contains("closes the cycle"), "{}", e);
        names_a_real_edge(&d, &e);
    }
}
