//! The strategy host: which assignment strategies this control plane can run, and running them
//! safely. Built-in strategies are linked statically; plugins are loaded by name from the plugin
//! directory (`--plugin-dir`). Both are called through the same C ABI vtable.
//!
//! The safety rules, each enforced here:
//! - **directory only**: a plugin is named, never given as a path; the name is checked as text,
//!   resolved inside the plugin directory with symlinks followed, and refused if it leaves it;
//! - **ABI version** checked before anything else in a library is read;
//! - **never unloaded**: a loaded library stays for the life of the process;
//! - **deadline**: each call runs on a thread of its own; a call that misses the deadline is an
//!   error for the caller, who is never blocked, and the strategy is disabled from then on;
//! - **validation**: every assignment returned is checked (every shard exactly once, live nodes
//!   that are not draining, capacity); a panic, garbage, a null reply or an invalid assignment is
//!   an [`Error`], never a crash, and the caller keeps the assignment in force.
//!
//! It must not touch cluster state: the active strategy and its config live in the cluster
//! state in KV (the `strategy` entry), and the assignment loop and the REST handlers pass them
//! in.

mod builtin;
mod call;
mod error;
mod library;
mod plugin_dir;
mod registry;
mod validate;

// Shared with the other modules' tests that need real plugin files.
#[cfg(test)]
pub(crate) mod tests;

pub use builtin::DEFAULT_STRATEGY;
pub use chronoshard_plugin_api::{Assignment, Input, Load, Node, Shard, ABI_VERSION};
pub use error::Error;
pub use plugin_dir::{file_name as plugin_file_name, MAX_NAME_LEN};
pub use registry::{Failure, Options, Origin, Registry, StrategyInfo, DEFAULT_DEADLINE};
pub use validate::Violation;
