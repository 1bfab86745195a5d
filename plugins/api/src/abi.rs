//! The C ABI between the control plane and a strategy: the one place with raw pointers.
//!
//! A plugin library exports two functions, found by name:
//! - `chronoshard_plugin_abi_version() -> u32`, read first: the host refuses any other version
//!   than its own [`crate::ABI_VERSION`] before it reads anything else;
//! - `chronoshard_plugin_strategy() -> *const StrategyVTable`.
//!
//! Each call in the vtable takes JSON bytes (pointer and length, borrowed for the call) and
//! writes a [`Buffer`] the plugin allocated; the host copies it and hands it back to the vtable's
//! own `free`, so memory is always freed by the allocator that made it. The return value is a
//! [`Status`]. Entry points made by [`vtable`] catch every panic: a panic becomes
//! [`Status::Panicked`] with its message, never an unwind across the boundary.
//!
//! The control plane links the built-in strategies statically and calls them through the same
//! vtable, so both paths run the same code. This module also holds that calling side
//! ([`StrategyVTable::assign`]), shared by the host and the test suite.

// Raw pointers, `extern "C"` entry points and the exported symbols are what an FFI boundary is
// made of; every unsafe block below says what makes it sound.
#![allow(unsafe_code)]

use std::{
    fmt,
    mem::ManuallyDrop,
    panic::{self, AssertUnwindSafe},
    slice,
};

use crate::{
    strategy::{run_assign, run_validate, Failure},
    Strategy, ABI_VERSION,
};

/// Name of the exported function that returns the plugin's ABI version (NUL-terminated, as
/// symbol lookups want it).
pub const ABI_VERSION_SYMBOL: &[u8] = b"chronoshard_plugin_abi_version\0";
/// Name of the exported function that returns the plugin's [`StrategyVTable`].
pub const STRATEGY_SYMBOL: &[u8] = b"chronoshard_plugin_strategy\0";

/// Type of the function behind [`ABI_VERSION_SYMBOL`].
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
/// Type of the function behind [`STRATEGY_SYMBOL`].
pub type StrategyFn = unsafe extern "C" fn() -> *const StrategyVTable;
/// A call: JSON input (`ptr`, `len`, borrowed), the reply written to `*output`, a [`Status`]
/// code returned.
pub type CallFn = unsafe extern "C" fn(input: *const u8, len: usize, output: *mut Buffer) -> i32;
/// Frees a [`Buffer`] that a [`CallFn`] of the same vtable wrote.
pub type FreeFn = unsafe extern "C" fn(buffer: Buffer);

/// Replies larger than this are refused unread (a plugin writing garbage lengths).
pub const MAX_REPLY_LEN: usize = 64 << 20;

/// Bytes owned by the plugin: a pointer, a length and the allocation's capacity.
#[repr(C)]
#[derive(Debug)]
pub struct Buffer {
    /// Start of the bytes; null when nothing was written.
    pub ptr: *mut u8,
    /// Bytes in use.
    pub len: usize,
    /// Size of the allocation, for the plugin's `free`.
    pub cap: usize,
}

impl Buffer {
    /// Nothing written yet: what the host passes in.
    pub const EMPTY: Buffer = Buffer {
        ptr: std::ptr::null_mut(),
        len: 0,
        cap: 0,
    };

    /// Hands a vector's allocation over to a buffer; [`free_buffer`] takes it back.
    pub fn from_vec(bytes: Vec<u8>) -> Buffer {
        let mut bytes = ManuallyDrop::new(bytes);
        Buffer {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
            cap: bytes.capacity(),
        }
    }
}

/// What a call returns.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The reply is the answer: `Output` JSON for `assign`, empty for `validate_config`.
    Ok = 0,
    /// The strategy returned an error; the reply is its message (UTF-8).
    Rejected = 1,
    /// The config does not parse or does not pass `check_config`; the reply says why.
    BadConfig = 2,
    /// The input JSON does not parse (a host and plugin disagreeing on the schema).
    BadInput = 3,
    /// The strategy panicked; the reply is the panic message.
    Panicked = 4,
}

impl Status {
    /// The status for a code, `None` for a code this ABI version does not define.
    pub fn from_code(code: i32) -> Option<Status> {
        [
            Status::Ok,
            Status::Rejected,
            Status::BadConfig,
            Status::BadInput,
            Status::Panicked,
        ]
        .into_iter()
        .find(|s| *s as i32 == code)
    }
}

/// A strategy behind the C ABI: what a plugin exports and what the host calls.
///
/// Every value upholds the ABI contract (the calls read only the input they are given, write
/// only `*output`, and `free` frees exactly what they wrote): [`vtable`] builds such values from a
/// [`Strategy`], and the other ways to obtain one are `unsafe`. That is what makes calling
/// [`StrategyVTable::assign`] safe.
#[repr(C)]
pub struct StrategyVTable {
    abi_version: u32,
    name_ptr: *const u8,
    name_len: usize,
    assign: CallFn,
    validate_config: CallFn,
    free: FreeFn,
}

// SAFETY: the only pointer is the name, which points to immutable bytes that live as long as the
// vtable (a `&'static str`); everything else is plain function pointers.
unsafe impl Sync for StrategyVTable {}
// SAFETY: as for `Sync`: nothing in a vtable is tied to a thread.
unsafe impl Send for StrategyVTable {}

impl fmt::Debug for StrategyVTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StrategyVTable")
            .field("name", &self.name())
            .field("abi_version", &self.abi_version)
            .finish_non_exhaustive()
    }
}

/// Why a call's reply could not be read: the plugin broke the ABI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The reply pointer was null.
    NullReply {
        /// Status code the call returned.
        code: i32,
    },
    /// The reply claimed more than [`MAX_REPLY_LEN`] bytes.
    TooLarge {
        /// The length claimed.
        len: usize,
    },
    /// The call returned a status code this ABI version does not define.
    UnknownStatus(i32),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::NullReply { code } => write!(f, "null reply (status code {code})"),
            CallError::TooLarge { len } => {
                write!(f, "reply of {len} bytes, more than {MAX_REPLY_LEN}")
            }
            CallError::UnknownStatus(code) => write!(f, "unknown status code {code}"),
        }
    }
}

impl std::error::Error for CallError {}

/// A call's status and a host-owned copy of its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// What the call says of itself.
    pub status: Status,
    /// The reply bytes, copied out of the plugin's buffer.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text, for error messages (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl StrategyVTable {
    /// A vtable from hand-written entry points, for a plugin that does not use [`vtable`].
    ///
    /// # Safety
    /// `assign` and `validate_config` must read at most `len` bytes from `input`, write only
    /// `*output`, return a [`Status`] code, never unwind, and be callable from any thread at
    /// once; `free` must free exactly a buffer they wrote, once.
    pub const unsafe fn from_raw_parts(
        name: &'static str,
        assign: CallFn,
        validate_config: CallFn,
        free: FreeFn,
    ) -> StrategyVTable {
        StrategyVTable {
            abi_version: ABI_VERSION,
            name_ptr: name.as_ptr(),
            name_len: name.len(),
            assign,
            validate_config,
            free,
        }
    }

    /// The ABI version the vtable was built for.
    pub fn abi_version(&self) -> u32 {
        self.abi_version
    }

    /// The strategy's own name (invalid UTF-8 replaced).
    pub fn name(&self) -> String {
        if self.name_ptr.is_null() {
            return String::new();
        }
        // SAFETY: by the type's invariant the name is `name_len` readable bytes for the
        // vtable's lifetime.
        let bytes = unsafe { slice::from_raw_parts(self.name_ptr, self.name_len) };
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Calls `assign` with `Input` JSON; an `Ok` reply is `Output` JSON.
    pub fn assign(&self, input: &[u8]) -> Result<Reply, CallError> {
        self.call(self.assign, input)
    }

    /// Calls `validate_config` with the config's JSON.
    pub fn validate_config(&self, config: &[u8]) -> Result<Reply, CallError> {
        self.call(self.validate_config, config)
    }

    fn call(&self, f: CallFn, input: &[u8]) -> Result<Reply, CallError> {
        let mut out = Buffer::EMPTY;
        // SAFETY: by the type's invariant `f` honours the contract of `from_raw_parts`; `input`
        // is valid for `input.len()` bytes and `out` is a live, writable `Buffer`.
        let code = unsafe { f(input.as_ptr(), input.len(), &mut out) };
        if out.ptr.is_null() {
            return Err(CallError::NullReply { code });
        }
        let body = if out.len > MAX_REPLY_LEN {
            Err(CallError::TooLarge { len: out.len })
        } else {
            // SAFETY: the call wrote `out`, so `ptr` holds `len` initialised bytes until freed.
            Ok(unsafe { slice::from_raw_parts(out.ptr, out.len) }.to_vec())
        };
        // SAFETY: `out` was written by a call of this vtable and is freed once, after the copy.
        unsafe { (self.free)(out) };
        let status = Status::from_code(code).ok_or(CallError::UnknownStatus(code))?;
        Ok(Reply {
            status,
            body: body?,
        })
    }
}

/// The vtable of a [`Strategy`]: entry points that catch panics and speak JSON.
/// [`crate::export_strategy!`] puts one in a static.
pub const fn vtable<S: Strategy>() -> StrategyVTable {
    StrategyVTable {
        abi_version: ABI_VERSION,
        name_ptr: S::NAME.as_ptr(),
        name_len: S::NAME.len(),
        assign: assign_entry::<S>,
        validate_config: validate_entry::<S>,
        free: free_buffer,
    }
}

unsafe extern "C" fn assign_entry<S: Strategy>(
    input: *const u8,
    len: usize,
    output: *mut Buffer,
) -> i32 {
    // SAFETY: the caller passes the arguments of a `CallFn`.
    unsafe { entry(input, len, output, run_assign::<S>) }
}

unsafe extern "C" fn validate_entry<S: Strategy>(
    input: *const u8,
    len: usize,
    output: *mut Buffer,
) -> i32 {
    // SAFETY: the caller passes the arguments of a `CallFn`.
    unsafe { entry(input, len, output, run_validate::<S>) }
}

/// Runs `body` on the input bytes with panics caught, and writes its reply to `*output`.
///
/// # Safety
/// `input` is null or valid for `len` bytes; `output` is null or writable.
unsafe fn entry(
    input: *const u8,
    len: usize,
    output: *mut Buffer,
    body: fn(&[u8]) -> Result<Vec<u8>, Failure>,
) -> i32 {
    if output.is_null() {
        return Status::BadInput as i32;
    }
    let bytes: &[u8] = if input.is_null() {
        &[]
    } else {
        // SAFETY: the caller guarantees `len` readable bytes at a non-null `input`.
        unsafe { slice::from_raw_parts(input, len) }
    };
    let (status, reply) = match panic::catch_unwind(AssertUnwindSafe(|| body(bytes))) {
        Ok(Ok(reply)) => (Status::Ok, reply),
        Ok(Err(failure)) => (failure.status, failure.message.into_bytes()),
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            // A payload whose drop panics would unwind out of this function: contain that too.
            let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(payload)));
            (Status::Panicked, message.into_bytes())
        }
    };
    // SAFETY: `output` is non-null and writable (checked above, guaranteed by the caller).
    unsafe { output.write(Buffer::from_vec(reply)) };
    status as i32
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Frees a buffer made by [`Buffer::from_vec`] in this library; the `free` of every vtable built by
/// [`vtable`], and usable by hand-written ones.
///
/// # Safety
/// `buffer` came from [`Buffer::from_vec`] in this same library and was not freed before.
pub unsafe extern "C" fn free_buffer(buffer: Buffer) {
    if buffer.ptr.is_null() {
        return;
    }
    // SAFETY: the parts are those of a `Vec<u8>` leaked by `Buffer::from_vec` (caller's promise).
    drop(unsafe { Vec::from_raw_parts(buffer.ptr, buffer.len, buffer.cap) });
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;
    use crate::{Assignment, Input};

    #[derive(Default, Deserialize)]
    struct Config {
        #[serde(default)]
        panic: bool,
    }

    struct Trivial;

    impl Strategy for Trivial {
        const NAME: &'static str = "trivial";
        type Config = Config;

        fn assign(input: &Input, config: &Config) -> Result<Assignment, String> {
            if config.panic {
                panic!("asked to panic with {} shards", input.shards.len());
            }
            let node = input.eligible_nodes().first().map(|n| n.id.clone());
            let node = node.ok_or("no node")?;
            Ok(input
                .shard_ids()
                .into_iter()
                .map(|s| (s, node.clone()))
                .collect())
        }
    }

    static TRIVIAL: StrategyVTable = vtable::<Trivial>();

    #[test]
    fn a_call_through_the_vtable_answers_in_json() {
        assert_eq!(TRIVIAL.name(), "trivial");
        assert_eq!(TRIVIAL.abi_version(), ABI_VERSION);
        let reply = TRIVIAL
            .assign(br#"{"shards":[{"id":2}],"nodes":[{"id":"a"}]}"#)
            .unwrap();
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(reply.text(), r#"{"assignment":{"2":"a"}}"#);
    }

    #[test]
    fn a_panic_comes_back_as_a_status_with_its_message() {
        let input = br#"{"shards":[{"id":1}],"nodes":[],"config":{"panic":true}}"#;
        let reply = TRIVIAL.assign(input).unwrap();
        assert_eq!(reply.status, Status::Panicked);
        assert_eq!(reply.text(), "asked to panic with 1 shards");
        // The library is still usable afterwards.
        let ok = TRIVIAL
            .assign(br#"{"shards":[],"nodes":[{"id":"a"}]}"#)
            .unwrap();
        assert_eq!(ok.status, Status::Ok);
    }

    #[test]
    fn garbage_input_and_errors_have_their_statuses() {
        assert_eq!(
            TRIVIAL.assign(b"\xff\x00").unwrap().status,
            Status::BadInput
        );
        let no_node = TRIVIAL
            .assign(br#"{"shards":[{"id":1}],"nodes":[]}"#)
            .unwrap();
        assert_eq!(
            (no_node.status, no_node.text().as_str()),
            (Status::Rejected, "no node")
        );
        let config = TRIVIAL.validate_config(br#"{"panic":"yes"}"#).unwrap();
        assert_eq!(config.status, Status::BadConfig);
        assert_eq!(TRIVIAL.validate_config(b"null").unwrap().status, Status::Ok);
    }

    unsafe extern "C" fn null_reply(_: *const u8, _: usize, _: *mut Buffer) -> i32 {
        0
    }

    unsafe extern "C" fn odd_status(_: *const u8, _: usize, output: *mut Buffer) -> i32 {
        // SAFETY: the host passes a writable buffer.
        unsafe { output.write(Buffer::from_vec(b"{}".to_vec())) };
        42
    }

    #[test]
    fn a_broken_reply_is_an_error_and_what_was_written_is_still_freed() {
        // SAFETY: both calls honour the contract except in what they return, which is the point.
        let broken = unsafe {
            StrategyVTable::from_raw_parts("broken", null_reply, odd_status, free_buffer)
        };
        assert_eq!(broken.assign(b"{}"), Err(CallError::NullReply { code: 0 }));
        assert_eq!(
            broken.validate_config(b"{}"),
            Err(CallError::UnknownStatus(42))
        );
    }

    #[test]
    fn status_codes_round_trip() {
        for code in 0..5 {
            assert_eq!(Status::from_code(code).map(|s| s as i32), Some(code));
        }
        assert_eq!(Status::from_code(5), None);
    }
}
