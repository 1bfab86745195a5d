//! Reading and writing JSON values in KV buckets, and reading a bucket back whole (`latest`).

use std::time::Duration;

use async_nats::jetstream::{self, kv::Store};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::{de::DeserializeOwned, Serialize};

use crate::{nats, Error, Result};

pub(crate) fn to_bytes<T: Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("cluster state serialises"))
}

pub(crate) async fn get_json<T: DeserializeOwned>(
    kv: &Store,
    key: &str,
    what: &'static str,
) -> Result<Option<T>> {
    kv.get(key)
        .await
        .map_err(nats(what))?
        .map(|b| decode(&b, what))
        .transpose()
}

pub(crate) async fn all_json<T: DeserializeOwned>(
    kv: &Store,
    what: &'static str,
) -> Result<Vec<T>> {
    latest(kv, what)
        .await?
        .iter()
        .map(|(_, value, _)| decode(value, what))
        .collect()
}

pub(crate) fn decode<T: DeserializeOwned>(value: &[u8], what: &'static str) -> Result<T> {
    serde_json::from_slice(value).map_err(|source| Error::Decode { what, source })
}

/// Longest wait for a bucket's current values (`latest`).
const READ_ALL_WITHIN: Duration = Duration::from_secs(10);
/// Messages asked for per fetch of `latest`.
pub(crate) const READ_ALL_FETCH: usize = 1024;

/// Every key of a bucket that holds a value, with the value and its revision, sorted by key.
///
/// Listing the keys (`Store::keys`) and then reading each was one request per key: at 1,024
/// shards, the control plane's assignment loop sent over a thousand requests every second. Here
/// a pull consumer delivers the last message of each key, values included, in stream order; a
/// later message of a key replaces an earlier one and a delete, purge or expiry marker removes
/// it, so a change made while the read runs is seen as the last word. Fetches that do not wait
/// (`no_wait`) end the read once one brings nothing: an entry that expires before it is
/// delivered cannot leave the read waiting for it (the hang async-nats fixed in its own
/// `keys()`). The consumer is deleted afterwards; one left by a failed read goes after 5 s idle.
pub(crate) async fn latest(kv: &Store, what: &'static str) -> Result<Vec<(String, Bytes, u64)>> {
    let consumer = kv
        .stream
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: format!("{}>", kv.prefix),
            deliver_policy: jetstream::consumer::DeliverPolicy::LastPerSubject,
            ack_policy: jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(5),
            memory_storage: true,
            ..Default::default()
        })
        .await
        .map_err(nats(what))?;
    let read = async {
        let mut keys: std::collections::BTreeMap<String, (Bytes, u64)> = Default::default();
        loop {
            let mut batch = consumer
                .fetch()
                .max_messages(READ_ALL_FETCH)
                .messages()
                .await
                .map_err(nats(what))?;
            let mut got = 0;
            while let Some(m) = batch
                .try_next()
                .await
                .map_err(|e| Error::Nats { what, source: e })?
            {
                got += 1;
                let revision = m
                    .info()
                    .map_err(|e| Error::Nats {
                        what,
                        source: e.to_string().into(),
                    })?
                    .stream_sequence;
                let Some(key) = m.subject.strip_prefix(kv.prefix.as_str()) else {
                    continue;
                };
                if is_put(&m) {
                    keys.insert(key.to_string(), (m.payload.clone(), revision));
                } else {
                    keys.remove(key);
                }
            }
            if got == 0 {
                return Ok(keys);
            }
        }
    };
    let keys = tokio::time::timeout(READ_ALL_WITHIN, read).await;
    let _ = kv
        .stream
        .delete_consumer(&consumer.cached_info().name)
        .await;
    Ok(keys
        .map_err(nats(what))??
        .into_iter()
        .map(|(key, (value, revision))| (key, value, revision))
        .collect())
}

/// A KV message that sets a value, not a delete, purge or expiry marker.
fn is_put(m: &jetstream::Message) -> bool {
    let Some(headers) = m.headers.as_ref() else {
        return true;
    };
    match headers.get("KV-Operation") {
        Some(op) => op.as_str() == "PUT",
        None => headers.get("Nats-Marker-Reason").is_none(),
    }
}
