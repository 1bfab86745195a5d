//! Loading: the built-ins, a plugin by name, names that are paths, symlinks, files that are not
//! plugins, another ABI version, and the zone-affinity example end to end.

use std::{collections::BTreeMap, fs, os::unix::fs::symlink};

use chronoshard_plugin_api::{testsuite::scenario, ABI_VERSION};
use serde_json::{json, Value};

use super::{plugin_dir, registry, GENEROUS};
use crate::strategy::{plugin_file_name, Error, Options, Origin, Registry, DEFAULT_STRATEGY};

#[tokio::test]
async fn the_builtins_are_listed_and_answer() {
    let registry = Registry::new(Options::default());
    let list = registry.list();
    let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "balanced",
            "consistent-hash",
            "least-loaded",
            "round-robin",
            "two-level"
        ]
    );
    assert!(list
        .iter()
        .all(|i| i.origin == Origin::Builtin && i.abi_version == ABI_VERSION && !i.disabled));
    for name in names {
        let a = registry.assign(name, scenario(16, 3, &Value::Null)).await;
        assert_eq!(
            a.map(|a| a.len()).map_err(|e| e.to_string()),
            Ok(16),
            "{name}"
        );
    }
    assert!(registry.info(DEFAULT_STRATEGY).is_some());
    let listed = serde_json::to_value(&list[0]).unwrap();
    let expected =
        json!({"name": "balanced", "origin": "builtin", "abi_version": 1, "disabled": false});
    assert_eq!(listed, expected);
}

#[tokio::test]
async fn a_plugin_loads_by_name_and_answers_like_its_builtin_twin() {
    let dir = plugin_dir(&[("chronoshard-strategy-balanced", "balanced-file")]);
    let registry = registry(&dir, GENEROUS);
    let info = registry.load("balanced-file").await.unwrap();
    let path = dir
        .path()
        .canonicalize()
        .unwrap()
        .join(plugin_file_name("balanced-file"));
    assert_eq!(info.origin, Origin::File { path });
    assert_eq!(info.abi_version, ABI_VERSION);
    // Loading again changes nothing: the library stays as it is.
    assert_eq!(registry.load("balanced-file").await.unwrap(), info);
    assert_eq!(registry.ensure("balanced-file").await.unwrap(), info);

    let mut input = scenario(40, 4, &Value::Null);
    input.nodes[1].capacity = Some(3);
    input.nodes[2].draining = true;
    let from_file = registry
        .assign("balanced-file", input.clone())
        .await
        .unwrap();
    assert_eq!(from_file, registry.assign("balanced", input).await.unwrap());
    assert!(registry.list().iter().any(|i| i.name == "balanced-file"));
}

#[tokio::test]
async fn names_that_are_paths_are_refused() {
    // `../faulty` would be a real plugin one level up.
    let outer = plugin_dir(&[("chronoshard-test-plugin-faulty", "faulty")]);
    let inner = outer.path().join("plugins");
    fs::create_dir(&inner).unwrap();
    let registry = Registry::new(Options {
        plugin_dir: Some(inner),
        deadline: GENEROUS,
    });
    for name in [
        "../faulty",
        "..",
        "plugins/../faulty",
        "/tmp/faulty",
        ".faulty",
        "faulty\0",
        "",
    ] {
        let refused = registry.load(name).await;
        assert!(
            matches!(refused, Err(Error::BadName { .. })),
            "{name:?}: {refused:?}"
        );
    }
    assert!(registry.info("../faulty").is_none());
}

#[tokio::test]
async fn a_symlink_out_of_the_directory_is_refused_and_one_inside_is_followed() {
    let outside = plugin_dir(&[("chronoshard-test-plugin-faulty", "faulty")]);
    let dir = plugin_dir(&[("chronoshard-test-plugin-faulty", "faulty")]);
    let file = |d: &tempfile::TempDir, name: &str| d.path().join(plugin_file_name(name));
    symlink(file(&outside, "faulty"), file(&dir, "escape")).unwrap();
    let relative = format!(
        "../{}/{}",
        outside.path().file_name().unwrap().to_str().unwrap(),
        plugin_file_name("faulty")
    );
    symlink(relative, file(&dir, "escape-relative")).unwrap();
    symlink(file(&dir, "faulty"), file(&dir, "alias")).unwrap();
    let registry = registry(&dir, GENEROUS);
    for name in ["escape", "escape-relative"] {
        let refused = registry.load(name).await;
        assert!(
            matches!(refused, Err(Error::OutsideDir { .. })),
            "{name}: {refused:?}"
        );
    }
    let alias = registry.load("alias").await.unwrap();
    let real = file(&dir, "faulty").canonicalize().unwrap();
    assert_eq!(alias.origin, Origin::File { path: real });
    let names: Vec<String> = registry.list().into_iter().map(|i| i.name).collect();
    assert!(!names.iter().any(|n| n.starts_with("escape")), "{names:?}");
}

#[tokio::test]
async fn files_that_are_not_plugins_of_this_abi_are_refused() {
    let dir = plugin_dir(&[
        ("chronoshard-test-plugin-future-abi", "future"),
        ("chronoshard-strategy-round-robin", "no-exports"),
    ]);
    fs::write(dir.path().join(plugin_file_name("junk")), "not a library").unwrap();
    fs::create_dir(dir.path().join(plugin_file_name("folder"))).unwrap();
    let registry = registry(&dir, GENEROUS);
    let outcome = |name: &'static str| {
        let registry = registry.clone();
        async move { registry.load(name).await }
    };
    assert!(matches!(
        outcome("missing").await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        outcome("folder").await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(outcome("junk").await, Err(Error::Open { .. })));
    assert!(matches!(
        outcome("no-exports").await,
        Err(Error::NotAPlugin { .. })
    ));
    match outcome("future").await {
        Err(Error::AbiMismatch {
            found, expected, ..
        }) => {
            assert_eq!((found, expected), (ABI_VERSION + 1, ABI_VERSION))
        }
        other => panic!("expected an ABI mismatch, got {other:?}"),
    }
    assert_eq!(
        registry.list().len(),
        5,
        "only the built-ins are registered"
    );
}

#[tokio::test]
async fn without_a_plugin_dir_only_builtins_exist() {
    let registry = Registry::new(Options::default());
    assert!(matches!(
        registry.load("zone-affinity").await,
        Err(Error::NoPluginDir)
    ));
    assert!(matches!(
        registry.ensure("zone-affinity").await,
        Err(Error::NoPluginDir)
    ));
    assert!(matches!(
        registry.load("balanced").await,
        Err(Error::BuiltinName { .. })
    ));
    let unknown = registry
        .assign("zone-affinity", scenario(1, 1, &Value::Null))
        .await;
    assert!(matches!(unknown, Err(Error::Unknown { .. })), "{unknown:?}");
}

#[tokio::test]
async fn the_zone_affinity_example_keeps_shards_in_their_zones() {
    let dir = plugin_dir(&[("chronoshard-plugin-zone-affinity", "zone-affinity")]);
    let registry = registry(&dir, GENEROUS);
    registry.load("zone-affinity").await.unwrap();
    let zones: BTreeMap<String, String> = (0..24)
        .map(|s| (s.to_string(), format!("z{}", s % 3)))
        .collect();
    let config = json!({ "shard_zones": zones });
    registry
        .validate_config("zone-affinity", &config)
        .await
        .unwrap();
    for bad in [
        json!({"zone_label": ""}),
        json!({"shard_zones": "z0"}),
        json!({"zones": {}}),
    ] {
        let refused = registry.validate_config("zone-affinity", &bad).await;
        assert!(
            matches!(refused, Err(Error::BadConfig { .. })),
            "{bad}: {refused:?}"
        );
    }

    // Six nodes in z0, z1, z2, z0, z1, z2; node-03 reaches z2's databases.
    let mut input = scenario(24, 6, &config);
    input.nodes[3].labels.insert("db_zone".into(), "z2".into());
    let zone_of = |node: &str| {
        let node = input.nodes.iter().find(|n| n.id == node).unwrap();
        node.labels
            .get("db_zone")
            .or(node.zone.as_ref())
            .cloned()
            .unwrap()
    };
    let first = registry
        .assign("zone-affinity", input.clone())
        .await
        .unwrap();
    for (shard, node) in &first {
        assert_eq!(
            zone_of(node),
            format!("z{}", shard % 3),
            "shard {shard} on {node}"
        );
    }
    // node-01 drains: its shards go to node-04, the other node of z1, and nothing else moves.
    input.previous = first.clone();
    input.nodes[1].draining = true;
    let second = registry
        .assign("zone-affinity", input.clone())
        .await
        .unwrap();
    for (shard, node) in &second {
        let expected = if first[shard] == "node-01" {
            "node-04"
        } else {
            first[shard].as_str()
        };
        assert_eq!(node, expected, "shard {shard}");
    }
}

/// What a replica's background load of the active strategy ran into is on record, for the
/// strategy that never got registered.
#[tokio::test]
async fn a_failed_ensure_is_recorded_as_the_strategys_last_error() {
    let dir = plugin_dir(&[]);
    let registry = registry(&dir, GENEROUS);
    let missing = registry.ensure("missing").await;
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );
    assert!(registry.info("missing").is_none());
    let last = registry.last_error("missing").expect("recorded");
    assert_eq!(last.reason, "load");
    assert!(last.message.contains("not found"), "{}", last.message);
    assert_eq!(registry.last_error("balanced"), None);
}
