//! `chronoshard-loadtest`: drives a running chronoshard platform (or one it starts itself) with a
//! scenario, watches what the platform does through its own probes, and reports how fast, how
//! late and how lossless it was.
//!
//! Layout: `scenario/` decides which jobs to create and what they must produce (pure);
//! `create.rs` sends them open-loop; `probe/` watches (dispatch subscriber, no-op worker, HTTP
//! sink, process sampler); `raw.rs` measures bare JetStream on the same machine; `stats.rs` and
//! `report/` turn samples into the JSON and HTML results. This crate only reads the platform
//! through its public contract (REST API, NATS subjects of docs/protocol.md, `/metrics`).

pub mod api;
pub mod args;
pub mod check;
pub mod create;
pub mod drain;
pub mod machine;
pub mod platform;
pub mod probe;
pub mod progress;
pub mod raw;
pub mod raw_only;
pub mod report;
pub mod run;
pub mod scenario;
pub mod stats;
pub mod summary;
