//! Opening a plugin library: the control plane's only unsafe code. The ABI version is read and
//! checked before anything else in the library is touched, and a library that passes is never
//! unloaded, so the vtable it hands out stays valid for the life of the process.

// Loading a shared library and calling into it through symbols found by name cannot be checked
// by the compiler; the checks it can do at run time are done here, each unsafe block says what
// the rest rests on.
#![allow(unsafe_code)]

use std::path::Path;

use chronoshard_plugin_api::{
    abi::{AbiVersionFn, StrategyFn, StrategyVTable, ABI_VERSION_SYMBOL, STRATEGY_SYMBOL},
    ABI_VERSION,
};
use libloading::Library;

use super::Error;

/// Loads the library at `path` (already resolved inside the plugin directory) and returns its
/// strategy, or says why it is not a usable plugin.
pub fn open(name: &str, path: &Path) -> Result<&'static StrategyVTable, Error> {
    let not_a_plugin = |reason: String| Error::NotAPlugin {
        name: name.to_string(),
        reason,
    };
    // SAFETY: loading runs the library's initialisers. The library comes from the plugin
    // directory, which only the operator can write to: what is in it is trusted as code.
    let library = unsafe { load(path) }.map_err(|source| Error::Open {
        name: name.to_string(),
        source,
    })?;
    // SAFETY: the symbol is declared with `AbiVersionFn`'s signature by every ABI version.
    let version = unsafe { library.get::<AbiVersionFn>(ABI_VERSION_SYMBOL) }
        .map(|f| *f)
        .map_err(|e| not_a_plugin(format!("no chronoshard_plugin_abi_version symbol ({e})")))?;
    // SAFETY: as above; the function takes nothing and returns a number.
    let found = unsafe { version() };
    if found != ABI_VERSION {
        // Unloading here is fine: nothing of the library is in use.
        return Err(Error::AbiMismatch {
            name: name.to_string(),
            found,
            expected: ABI_VERSION,
        });
    }
    // SAFETY: the version matched, so the symbol has `StrategyFn`'s signature.
    let strategy = unsafe { library.get::<StrategyFn>(STRATEGY_SYMBOL) }
        .map(|f| *f)
        .map_err(|e| not_a_plugin(format!("no chronoshard_plugin_strategy symbol ({e})")))?;
    // SAFETY: as above; the function takes nothing and returns a pointer.
    let vtable = unsafe { strategy() };
    if vtable.is_null() || !vtable.is_aligned() {
        return Err(not_a_plugin(format!(
            "its strategy pointer {vtable:p} is unusable"
        )));
    }
    // Never unloaded: the vtable, its name and every call point into the library.
    std::mem::forget(library);
    // SAFETY: non-null and aligned, and a library of this ABI version points it at a
    // `StrategyVTable` that lives as long as the library, which is now the process.
    let vtable: &'static StrategyVTable = unsafe { &*vtable };
    if vtable.abi_version() != ABI_VERSION {
        return Err(not_a_plugin(format!(
            "its vtable says ABI version {}",
            vtable.abi_version()
        )));
    }
    Ok(vtable)
}

/// `dlopen` with `RTLD_NOW`, so a library with unresolved symbols fails here rather than in the
/// middle of a call; `RTLD_LOCAL`, so plugins cannot see each other's symbols.
///
/// # Safety
/// Runs the library's initialisers.
#[cfg(unix)]
unsafe fn load(path: &Path) -> Result<Library, libloading::Error> {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: the caller's promise.
    unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Library::from)
}

/// # Safety
/// Runs the library's initialisers.
#[cfg(not(unix))]
unsafe fn load(path: &Path) -> Result<Library, libloading::Error> {
    // SAFETY: the caller's promise.
    unsafe { Library::new(path) }
}
