//! Where jobs live: pure functions of the cluster config, the same in every control-plane replica
//! and shard node. No I/O, no clock (callers pass the instant).
//!
//! - `Ring`: the consistent-hash ring of `n` shards (`hashring`, SipHash with fixed keys, 256
//!   points per shard) on which a 16-bit routing key (or, in clusters of an early version, a
//!   tenant's name) is placed. Adding shards moves only the keys that now fall on an added one.
//! - `WindowPlacement`: a `time_window` cluster's layouts (`chronoshard_wire::rpc::Windows`). Due
//!   time is cut into windows, each window is spread over the shards of its layout by the job's
//!   own routing key, and a job's occurrence due at `t` belongs to the shard its key has in the
//!   layout of `t`'s window.
//!
//! Deciding who owns a shard, or when a layout is added, is the control plane's; this crate only
//! answers where a key goes.

mod ring;
mod windows;

pub use ring::Ring;
pub use windows::WindowPlacement;
