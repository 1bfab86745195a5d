//! A strategy that misbehaves on request, for the control plane's plugin-host tests: it panics,
//! sleeps past the deadline, fails, or answers an assignment the host must refuse. Built with the
//! SDK's macro like any plugin, so a panic here tests the macro's `catch_unwind`. Never deployed.
//!
//! Config: `{"mode": "<mode>", "sleep_ms": N}`; without a mode it answers correctly.

use std::{thread, time::Duration};

use chronoshard_plugin_api::{
    balance::{spread, Slot},
    export_strategy,
    serde::Deserialize,
    Assignment, Input, Strategy,
};

/// What to do wrong.
#[derive(Debug, Default, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", rename_all = "kebab-case")]
pub enum Mode {
    /// Answer correctly.
    #[default]
    Ok,
    /// Panic inside `assign`.
    Panic,
    /// Sleep `sleep_ms`, then answer correctly.
    Sleep,
    /// Return an error.
    Fail,
    /// Leave the lowest shard out.
    MissingShard,
    /// Add a shard that is not in the input.
    ExtraShard,
    /// Put the lowest shard on the first draining node.
    Draining,
    /// Put the lowest shard on a node that does not exist.
    UnknownNode,
    /// Put every shard on the first node that has a capacity.
    OverCapacity,
}

/// The test's instructions.
#[derive(Debug, Default, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", default)]
pub struct Config {
    /// What to do.
    pub mode: Mode,
    /// How long `sleep` sleeps.
    pub sleep_ms: u64,
}

/// See the crate documentation.
#[derive(Debug)]
pub struct Faulty;

impl Strategy for Faulty {
    const NAME: &'static str = "faulty";
    type Config = Config;

    fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
        let nodes = input.eligible_nodes();
        let slots: Vec<Slot> = nodes
            .iter()
            .map(|n| Slot {
                node: &n.id,
                capacity: n.max_shards(),
            })
            .collect();
        let lowest = input.shard_ids().first().copied().unwrap_or(0);
        let mut answer = spread(&input.shard_ids(), &slots, &input.previous);
        match config.mode {
            Mode::Ok => {}
            Mode::Panic => panic!("faulty plugin panics as asked"),
            // Sleeping is this mode's whole point: it stands for a strategy that hangs.
            Mode::Sleep => thread::sleep(Duration::from_millis(config.sleep_ms)),
            Mode::Fail => return Err("faulty plugin fails as asked".into()),
            Mode::MissingShard => {
                answer = answer.map(|mut a| {
                    a.remove(&lowest);
                    a
                })
            }
            Mode::ExtraShard => {
                let node = nodes.first().map(|n| n.id.clone()).unwrap_or_default();
                answer = answer.map(|mut a| {
                    a.insert(u32::MAX, node);
                    a
                })
            }
            Mode::Draining => {
                let drainer = input
                    .nodes
                    .iter()
                    .find(|n| n.draining)
                    .map(|n| n.id.clone());
                answer = answer.map(|mut a| {
                    a.insert(lowest, drainer.unwrap_or_default());
                    a
                })
            }
            Mode::UnknownNode => {
                answer = answer.map(|mut a| {
                    a.insert(lowest, "nowhere".into());
                    a
                })
            }
            Mode::OverCapacity => {
                let full = nodes.iter().find(|n| n.capacity.is_some());
                let full = full.map(|n| n.id.clone()).unwrap_or_default();
                answer = Ok(input
                    .shard_ids()
                    .into_iter()
                    .map(|s| (s, full.clone()))
                    .collect())
            }
        }
        answer
    }
}

export_strategy!(Faulty);
