//! A plugin that implements the C ABI by hand instead of through the SDK's macro, to answer what
//! the macro never would: bytes that are not JSON, a null reply, a shard listed twice, a status
//! code the ABI does not define. For the control plane's plugin-host tests; never deployed.
//!
//! The mode is the `mode` string of the strategy config; without one it answers correctly.

// A hand-written C ABI (exported symbols, raw pointers) is this crate's purpose.
#![allow(unsafe_code)]

use chronoshard_plugin_api::{
    abi::{free_buffer, Buffer, Status, StrategyVTable},
    serde_json::{self, Value},
    ABI_VERSION,
};

static VTABLE: StrategyVTable =
    // SAFETY: `assign` and `validate` read only `len` bytes of their input, write only
    // `*output` with buffers from `Buffer::from_vec`, which `free_buffer` frees, and cannot
    // panic (no indexing, no unwrap).
    unsafe { StrategyVTable::from_raw_parts("raw", assign, validate, free_buffer) };

/// The ABI version this library speaks.
#[unsafe(no_mangle)]
pub extern "C" fn chronoshard_plugin_abi_version() -> u32 {
    ABI_VERSION
}

/// This library's vtable.
#[unsafe(no_mangle)]
pub extern "C" fn chronoshard_plugin_strategy() -> *const StrategyVTable {
    &VTABLE
}

/// # Safety
/// `input` holds `len` readable bytes and `output` is writable, as the ABI promises.
unsafe extern "C" fn assign(input: *const u8, len: usize, output: *mut Buffer) -> i32 {
    // SAFETY: the caller's promise.
    let input: Value = serde_json::from_slice(unsafe { std::slice::from_raw_parts(input, len) })
        .unwrap_or(Value::Null);
    let mode = input["config"]["mode"].as_str().unwrap_or("ok");
    let shards: Vec<u64> = input["shards"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["id"].as_u64()).collect())
        .unwrap_or_default();
    let node = input["nodes"][0]["id"].as_str().unwrap_or("none");
    let pairs: Vec<String> = shards
        .iter()
        .map(|s| format!("\"{s}\":\"{node}\""))
        .collect();
    let (status, body) = match mode {
        "garbage" => (Status::Ok as i32, b"this is not json {".to_vec()),
        "null" => return Status::Ok as i32,
        "bad-status" => (42, b"{}".to_vec()),
        "duplicate" => {
            let first = pairs.first().cloned().unwrap_or_default();
            let body = format!("{{\"assignment\":{{{},{first}}}}}", pairs.join(","));
            (Status::Ok as i32, body.into_bytes())
        }
        _ => {
            let body = format!("{{\"assignment\":{{{}}}}}", pairs.join(","));
            (Status::Ok as i32, body.into_bytes())
        }
    };
    // SAFETY: the caller's promise.
    unsafe { output.write(Buffer::from_vec(body)) };
    status
}

/// Accepts every config.
///
/// # Safety
/// As for `assign`.
unsafe extern "C" fn validate(_input: *const u8, _len: usize, output: *mut Buffer) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { output.write(Buffer::from_vec(Vec::new())) };
    Status::Ok as i32
}
