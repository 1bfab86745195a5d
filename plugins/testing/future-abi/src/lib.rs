//! A library that claims a plugin ABI version newer than the SDK's, for the control plane's test
//! that such a plugin is refused at load time, before anything else in it is read.

// Exported symbols are unsafe code by the lint's definition; exporting them is this crate's point.
#![allow(unsafe_code)]

use chronoshard_plugin_api::{abi::StrategyVTable, ABI_VERSION};

/// One more than the SDK's version.
#[unsafe(no_mangle)]
pub extern "C" fn chronoshard_plugin_abi_version() -> u32 {
    ABI_VERSION + 1
}

/// Never read: the version check comes first. Null, so a host that did read it would notice.
#[unsafe(no_mangle)]
pub extern "C" fn chronoshard_plugin_strategy() -> *const StrategyVTable {
    std::ptr::null()
}
