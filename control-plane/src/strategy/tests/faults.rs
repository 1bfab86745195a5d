//! Plugins that misbehave: each misdeed is an error for the caller, never a crash of the host,
//! and only a missed deadline disables a strategy.

use std::time::{Duration, Instant};

use chronoshard_plugin_api::{testsuite::scenario, Input};
use serde_json::{json, Value};

use super::{plugin_dir, registry, GENEROUS};
use crate::strategy::{Error, Registry, Violation};

/// Eight shards on three nodes (node-02 draining, node-01 with room for 3), for `faulty` or
/// `raw` in `mode`.
fn input(mode: &str) -> Input {
    let mut input = scenario(8, 3, &json!({ "mode": mode, "sleep_ms": 5_000 }));
    input.nodes[1].capacity = Some(3);
    input.nodes[2].draining = true;
    input
}

async fn loaded(names: &[(&str, &str)], deadline: Duration) -> (tempfile::TempDir, Registry) {
    let dir = plugin_dir(names);
    let registry = registry(&dir, deadline);
    for (_, name) in names {
        registry.load(name).await.unwrap();
    }
    (dir, registry)
}

#[tokio::test]
async fn a_panic_in_a_plugin_is_an_error_and_the_plugin_stays_usable() {
    let (_dir, registry) = loaded(&[("chronoshard-test-plugin-faulty", "faulty")], GENEROUS).await;
    match registry.assign("faulty", input("panic")).await {
        Err(Error::Panicked { message, .. }) => {
            assert_eq!(message, "faulty plugin panics as asked")
        }
        other => panic!("expected a caught panic, got {other:?}"),
    }
    let fine = registry.assign("faulty", input("ok")).await.unwrap();
    assert_eq!(fine.len(), 8);
    let info = registry.info("faulty").unwrap();
    assert!(!info.disabled);
    // The panic stays on record after a good call, for the operator to see.
    let last = info.last_error.expect("the panic is recorded");
    assert_eq!(last.reason, "panicked");
    assert!(last.message.contains("panics as asked"), "{}", last.message);
}

#[tokio::test]
async fn a_plugin_past_its_deadline_is_disabled_without_blocking_the_caller() {
    let deadline = Duration::from_millis(200);
    let (_dir, registry) = loaded(&[("chronoshard-test-plugin-faulty", "faulty")], deadline).await;
    let started = Instant::now();
    let late = registry.assign("faulty", input("sleep")).await;
    let waited = started.elapsed();
    assert!(matches!(late, Err(Error::Timeout { .. })), "{late:?}");
    // The plugin sleeps 5 s; the caller got its answer long before.
    assert!(waited < Duration::from_secs(4), "waited {waited:?}");

    assert!(registry.info("faulty").unwrap().disabled);
    let refused = registry.assign("faulty", input("ok")).await;
    assert!(
        matches!(refused, Err(Error::Disabled { .. })),
        "{refused:?}"
    );
    // The refusals do not hide why it was disabled.
    let last = registry.last_error("faulty").unwrap();
    assert_eq!(last.reason, "timeout", "{last:?}");
    let refused = registry.validate_config("faulty", &Value::Null).await;
    assert!(
        matches!(refused, Err(Error::Disabled { .. })),
        "{refused:?}"
    );
    // Other strategies are not affected.
    let mut plain = input("ok");
    plain.config = Value::Null;
    assert_eq!(registry.assign("balanced", plain).await.unwrap().len(), 8);
}

#[tokio::test]
async fn garbage_a_null_reply_and_an_undefined_status_are_errors() {
    let (_dir, registry) = loaded(&[("chronoshard-test-plugin-raw", "raw")], GENEROUS).await;
    assert_eq!(registry.assign("raw", input("ok")).await.unwrap().len(), 8);
    for mode in ["garbage", "null", "bad-status"] {
        let broken = registry.assign("raw", input(mode)).await;
        assert!(
            matches!(broken, Err(Error::BadReply { .. })),
            "{mode}: {broken:?}"
        );
    }
    let twice = registry.assign("raw", input("duplicate")).await;
    assert!(
        matches!(
            twice,
            Err(Error::InvalidAssignment {
                violation: Violation::Duplicate { shard: 0 },
                ..
            })
        ),
        "{twice:?}"
    );
}

#[tokio::test]
async fn invalid_assignments_are_refused_with_the_reason() {
    let (_dir, registry) = loaded(&[("chronoshard-test-plugin-faulty", "faulty")], GENEROUS).await;
    let cases = [
        ("missing-shard", Violation::Missing { shard: 0 }),
        ("extra-shard", Violation::UnknownShard { shard: u32::MAX }),
        (
            "unknown-node",
            Violation::UnknownNode {
                shard: 0,
                node: "nowhere".into(),
            },
        ),
        (
            "draining",
            Violation::Draining {
                shard: 0,
                node: "node-02".into(),
            },
        ),
        (
            "over-capacity",
            Violation::OverCapacity {
                node: "node-01".into(),
                held: 8,
                capacity: 3,
            },
        ),
    ];
    for (mode, expected) in cases {
        match registry.assign("faulty", input(mode)).await {
            Err(Error::InvalidAssignment { violation, .. }) => {
                assert_eq!(violation, expected, "{mode}")
            }
            other => panic!("{mode}: expected {expected:?}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_strategy_error_a_bad_config_and_a_bad_input_are_told_apart() {
    let (_dir, registry) = loaded(&[("chronoshard-test-plugin-faulty", "faulty")], GENEROUS).await;
    let failed = registry.assign("faulty", input("fail")).await;
    assert!(matches!(failed, Err(Error::Failed { .. })), "{failed:?}");
    let mut unknown_mode = input("ok");
    unknown_mode.config = json!({"mode": "dance"});
    let bad_config = registry.assign("faulty", unknown_mode).await;
    assert!(
        matches!(bad_config, Err(Error::BadConfig { .. })),
        "{bad_config:?}"
    );
    let refused = registry
        .validate_config("consistent-hash", &json!({"vnodes": 0}))
        .await;
    assert!(
        matches!(refused, Err(Error::BadConfig { .. })),
        "{refused:?}"
    );
    registry
        .validate_config("consistent-hash", &json!({"vnodes": 64}))
        .await
        .unwrap();

    let mut twice = input("ok");
    twice.nodes.push(twice.nodes[0].clone());
    let invalid = registry.assign("faulty", twice).await;
    assert!(
        matches!(invalid, Err(Error::InvalidInput { .. })),
        "{invalid:?}"
    );
    // Not enough room for every shard is the strategy's error to report.
    let mut cramped = input("ok");
    cramped.nodes[0].capacity = Some(1);
    cramped.config = Value::Null;
    let cramped = registry.assign("balanced", cramped).await;
    assert!(matches!(cramped, Err(Error::Failed { .. })), "{cramped:?}");
}
