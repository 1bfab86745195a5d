//! The assignment-strategy plugin SDK: the only crate a strategy plugin depends on.
//!
//! A strategy is a pure function `(cluster, previous assignment, config) → assignment`: no I/O,
//! no clock, so replicas agree and it can be property-tested. It crosses the plugin boundary as a
//! C ABI carrying JSON, so a plugin built by another compiler version, or in another language,
//! still works.
//!
//! - [`model`]: the JSON model ([`Input`], [`Node`], [`Shard`], [`Output`]);
//! - [`Strategy`]: the safe trait a plugin implements, and [`export_strategy!`], which wraps it
//!   in C entry points that catch panics;
//! - [`abi`]: the C ABI itself (symbols, vtable, buffers, statuses) and its calling side;
//! - [`balance`]: the even, sticky spreading of the built-in `balanced` strategy, as a building
//!   block for other strategies;
//! - `testsuite` (feature `testsuite`): the contract tests every strategy passes.
//!
//! Loading libraries, deadlines and checking what a strategy returns are the control plane's job
//! (its `strategy` module), not this crate's.
//!
//! # Writing a plugin
//! ```
//! use chronoshard_plugin_api::{export_strategy, Assignment, Input, Strategy};
//!
//! pub struct FirstNode;
//!
//! impl Strategy for FirstNode {
//!     const NAME: &'static str = "first-node";
//!     type Config = ();
//!
//!     fn assign(input: &Input, _config: &()) -> Result<Assignment, String> {
//!         let nodes = input.eligible_nodes();
//!         input.ensure_room(&nodes)?;
//!         let mut out = Assignment::new();
//!         let mut nodes = nodes.iter().flat_map(|n| std::iter::repeat_n(n, n.max_shards()));
//!         for shard in input.shard_ids() {
//!             out.insert(shard, nodes.next().ok_or("no room")?.id.clone());
//!         }
//!         Ok(out)
//!     }
//! }
//!
//! export_strategy!(FirstNode);
//! ```
//! Build it as a `cdylib` with the crate's `plugin` feature on (see [`export_strategy!`]).

#![warn(missing_docs)]

pub mod abi;
pub mod balance;
mod compat;
pub mod model;
mod strategy;
#[cfg(feature = "testsuite")]
pub mod testsuite;

pub use compat::{balanced, Problem};
pub use model::{Assignment, Input, Load, Node, Output, Shard};
pub use strategy::{parse_config, Strategy};
// Re-exported so a plugin needs no other dependency for its config type:
// `#[derive(Deserialize)] #[serde(crate = "chronoshard_plugin_api::serde")]`.
pub use serde;
pub use serde_json;

/// Version of the C ABI and of the JSON model it carries. A plugin built for another version is
/// refused at load time. Adding an optional field keeps the version; anything else bumps it.
pub const ABI_VERSION: u32 = 1;

/// Wraps a [`Strategy`] in C entry points.
///
/// `export_strategy!(MyStrategy)` defines, in the calling module:
/// - `pub static STRATEGY: abi::StrategyVTable`, the strategy behind the C ABI. The control plane
///   links the built-in strategies statically and registers these statics;
/// - when the calling crate's cargo feature `plugin` is on, the two exported symbols
///   `chronoshard_plugin_abi_version` and `chronoshard_plugin_strategy` that the host looks up in
///   a loaded library.
///
/// Why a feature: two libraries that export the same unmangled symbol cannot both be linked into
/// one binary, and the control plane links every built-in strategy. So the built-ins leave
/// `plugin` off by default (`cargo build -p <crate> --features plugin` makes the `.so`), and a
/// crate only ever built as a plugin turns it on by default:
/// ```toml
/// [lib]
/// crate-type = ["cdylib"]
/// [features]
/// default = ["plugin"]
/// plugin = []
/// ```
#[macro_export]
macro_rules! export_strategy {
    ($strategy:ty) => {
        /// This crate's strategy behind the plugin C ABI.
        pub static STRATEGY: $crate::abi::StrategyVTable = $crate::abi::vtable::<$strategy>();

        /// The plugin ABI version this library was built for.
        #[cfg(feature = "plugin")]
        // An unmangled export counts as unsafe code; the host finds these by name.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub extern "C" fn chronoshard_plugin_abi_version() -> u32 {
            $crate::ABI_VERSION
        }

        /// This library's strategy.
        #[cfg(feature = "plugin")]
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub extern "C" fn chronoshard_plugin_strategy() -> *const $crate::abi::StrategyVTable {
            &STRATEGY
        }
    };
}
