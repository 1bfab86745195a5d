//! The `chronoshard` command's subcommands. Each role composes library components; none holds
//! logic of its own beyond wiring, so tests start exactly what users start. `client` holds the
//! verbs that call a running platform's REST API (`jobs`, `runs`, `dlq`, ...).

pub mod client;
pub mod config;
pub mod control_plane;
pub mod dev;
pub mod node;
pub mod worker;
