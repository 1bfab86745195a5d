//! Example assignment-strategy plugin: each shard stays in the zone its database lives in, and
//! the shards of a zone are spread evenly over that zone's nodes.
//!
//! A shard's zone comes from the config (`shard_zones`: shard → zone), where the operator records
//! where each shard's database is. A node's zone is its `db_zone` label (the zone whose databases
//! it reaches; the label's name is `zone_label`), or else its `zone`. Inside a zone the shards
//! are spread with the SDK's `balance::spread`: even shares within capacity, a shard staying on
//! its node while that node keeps its share. Shards without a zone, and, unless `strict`, shards
//! whose zone has no accepting node or too little room, are spread over all nodes with the room
//! left.
//!
//! Config:
//! ```json
//! {"shard_zones": {"0": "eu-west-1a", "1": "eu-west-1b"}, "zone_label": "db_zone", "strict": false}
//! ```
//! With `strict: true` a shard that cannot stay in its zone is an error, so the control plane
//! keeps the assignment in force instead of moving a shard away from its database.

use std::collections::BTreeMap;

use chronoshard_plugin_api::{
    balance::{spread, Slot},
    export_strategy,
    serde::Deserialize,
    Assignment, Input, Node, Strategy,
};

/// The strategy's settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(crate = "chronoshard_plugin_api::serde", deny_unknown_fields, default)]
pub struct Config {
    /// Shard → the zone its database lives in.
    pub shard_zones: BTreeMap<u32, String>,
    /// The node label that names a node's zone; a node without it is in its `zone`.
    pub zone_label: String,
    /// Refuse, rather than place a shard outside its zone.
    pub strict: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            shard_zones: BTreeMap::new(),
            zone_label: "db_zone".to_string(),
            strict: false,
        }
    }
}

/// See the crate documentation.
#[derive(Debug)]
pub struct ZoneAffinity;

impl Strategy for ZoneAffinity {
    const NAME: &'static str = "zone-affinity";
    type Config = Config;

    fn check_config(config: &Config) -> Result<(), String> {
        if config.zone_label.is_empty() {
            return Err("zone_label must not be empty".into());
        }
        match config.shard_zones.iter().find(|(_, zone)| zone.is_empty()) {
            Some((shard, _)) => Err(format!("shard {shard} has an empty zone")),
            None => Ok(()),
        }
    }

    fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
        let nodes = input.eligible_nodes();
        input.ensure_room(&nodes)?;
        let mut by_zone: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        let mut anywhere = Vec::new();
        for shard in input.shard_ids() {
            match config.shard_zones.get(&shard) {
                Some(zone) => by_zone.entry(zone).or_default().push(shard),
                None => anywhere.push(shard),
            }
        }
        let mut out = Assignment::new();
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for (zone, shards) in by_zone {
            let local: Vec<&Node> = nodes
                .iter()
                .copied()
                .filter(|n| zone_of(n, &config.zone_label) == Some(zone))
                .collect();
            let room = local
                .iter()
                .fold(0usize, |sum, n| sum.saturating_add(n.max_shards()));
            if config.strict && room < shards.len() {
                return Err(format!(
                    "zone {zone} has room for {room} of its {} shards",
                    shards.len()
                ));
            }
            // The lowest ids stay in the zone; the rest, if any, go wherever there is room.
            let (stay, leave) = shards.split_at(room.min(shards.len()));
            anywhere.extend_from_slice(leave);
            let placed = spread(stay, &slots(&local, &held), &input.previous)?;
            record(&mut out, &mut held, placed, &nodes);
        }
        let placed = spread(&anywhere, &slots(&nodes, &held), &input.previous)?;
        record(&mut out, &mut held, placed, &nodes);
        Ok(out)
    }
}

export_strategy!(ZoneAffinity);

/// A node's zone: its zone label, or else its `zone`.
pub fn zone_of<'a>(node: &'a Node, label: &str) -> Option<&'a str> {
    node.labels
        .get(label)
        .or(node.zone.as_ref())
        .map(String::as_str)
}

/// The room each node has left after the shards already placed.
fn slots<'a>(nodes: &[&'a Node], held: &BTreeMap<&str, usize>) -> Vec<Slot<'a>> {
    nodes
        .iter()
        .map(|n| Slot {
            node: &n.id,
            capacity: n
                .max_shards()
                .saturating_sub(held.get(n.id.as_str()).copied().unwrap_or(0)),
        })
        .collect()
}

fn record<'a>(
    out: &mut Assignment,
    held: &mut BTreeMap<&'a str, usize>,
    placed: Assignment,
    nodes: &[&'a Node],
) {
    for (shard, node) in placed {
        if let Some(n) = nodes.iter().find(|n| n.id == node) {
            *held.entry(n.id.as_str()).or_default() += 1;
        }
        out.insert(shard, node);
    }
}
