//! The `chronoshard` command's subcommands. Each one composes library components; none holds
//! logic of its own beyond wiring, so tests start exactly what users start.

pub mod config;
pub mod control_plane;
pub mod dev;
pub mod node;
pub mod worker;
