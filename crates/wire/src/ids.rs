//! The layout of job and ticket ids: a UUIDv7 whose last two bytes are a routing key, so that an
//! id leads to its shard (how a key maps to a shard is the control plane's placement). A ticket
//! carries its job's key, a job its tenant's.

use std::hash::{BuildHasher, Hasher};

use uuid::Uuid;

/// A tenant's routing key: the top 16 bits of SipHash-2-4 (zero keys) of its name's bytes alone,
/// not through `Hash for str` (whose framing is std's to change): job ids keep these bits for as
/// long as the job exists.
pub fn tenant_key(tenant: &str) -> u16 {
    let mut h = hashring::DefaultHashBuilder.build_hasher();
    h.write(tenant.as_bytes());
    (h.finish() >> 48) as u16
}

/// A job's own routing key in a `time_window` cluster, where a tenant's jobs spread over the
/// shards: chosen at random, or from the tenant and the create's idempotency key when it has one,
/// so that a create sent again reaches the shard that remembers the key.
pub fn job_key(tenant: &str, idempotency_key: Option<&str>) -> u16 {
    let Some(key) = idempotency_key else {
        let b = Uuid::new_v4().into_bytes();
        return u16::from_be_bytes([b[0], b[1]]);
    };
    let mut h = hashring::DefaultHashBuilder.build_hasher();
    h.write(tenant.as_bytes());
    // A byte no tenant name holds keeps ("ab", "c") apart from ("a", "bc").
    h.write_u8(0);
    h.write(key.as_bytes());
    (h.finish() >> 48) as u16
}

/// A new id ending with `key`. The 48-bit millisecond time and the 42-bit counter before the key
/// are `Uuid::now_v7`'s, so ids minted by one process stay unique and increasing; 16 random bits
/// remain against another process minting in the same millisecond.
pub fn mint(key: u16) -> Uuid {
    let mut b = *Uuid::now_v7().as_bytes();
    b[14..].copy_from_slice(&key.to_be_bytes());
    Uuid::from_bytes(b)
}

/// The routing key an id minted by `mint` carries.
pub fn routing_key(id: Uuid) -> u16 {
    let b = id.as_bytes();
    u16::from_be_bytes([b[14], b[15]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_id_is_a_v7_uuid_that_keeps_its_key_and_increases() {
        let mut last = Uuid::nil();
        for key in [0, 1, 0xbeef, u16::MAX, 0] {
            let id = mint(key);
            assert_eq!(id.get_version_num(), 7);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(routing_key(id), key);
            assert!(id > last, "{id} after {last}");
            last = id;
        }
    }

    #[test]
    fn a_job_key_follows_the_idempotency_key_and_is_random_without_one() {
        let k = job_key("acme", Some("order-1"));
        assert_eq!(job_key("acme", Some("order-1")), k);
        assert_ne!(job_key("acm", Some("eorder-1")), k);
        let keys: std::collections::HashSet<u16> = (0..64)
            .map(|i| job_key("acme", Some(&format!("order-{i}"))))
            .collect();
        assert!(
            keys.len() > 60,
            "keyed creates of one tenant spread: {}",
            keys.len()
        );
        let random: std::collections::HashSet<u16> =
            (0..64).map(|_| job_key("acme", None)).collect();
        assert!(
            random.len() > 60,
            "unkeyed creates spread: {}",
            random.len()
        );
    }
}
