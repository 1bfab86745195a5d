//! API tokens in the shard bucket (`token.<id>`): created once, read whole, followed by a watch,
//! removed on revocation. Only records with a hash of the secret are stored; this module never
//! sees a secret.

use async_nats::jetstream::kv;
use chronoshard_wire::{names, token::TokenRecord};
use uuid::Uuid;

use crate::{
    nats,
    read::{decode, latest, to_bytes},
    Cluster, Error, Result,
};

impl Cluster {
    /// Stores a new token's record; a record with its id already there is a conflict.
    pub async fn create_token(&self, record: &TokenRecord) -> Result<()> {
        match self
            .buckets
            .shards
            .create(names::token_key(&record.id), to_bytes(record))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Err(Error::Conflict {
                what: "create a token",
            }),
            Err(e) => Err(nats("create a token")(e)),
        }
    }

    /// Every token's record, by id.
    pub async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        let mut out = Vec::new();
        for (key, value, _) in latest(&self.buckets.shards, "read tokens").await? {
            if key.starts_with("token.") {
                out.push(decode(&value, "token")?);
            }
        }
        Ok(out)
    }

    /// Revokes a token: true when it existed.
    pub async fn revoke_token(&self, id: &Uuid) -> Result<bool> {
        let key = names::token_key(id);
        let exists = self
            .buckets
            .shards
            .get(&key)
            .await
            .map_err(nats("read a token"))?
            .is_some();
        if exists {
            self.buckets
                .shards
                .purge(&key)
                .await
                .map_err(nats("revoke a token"))?;
        }
        Ok(exists)
    }

    /// A watch over the tokens: every record there now, then every creation and revocation.
    pub async fn watch_tokens(&self) -> Result<kv::Watch> {
        self.buckets
            .shards
            .watch_with_history(names::TOKEN_KEYS)
            .await
            .map_err(nats("watch tokens"))
    }
}
