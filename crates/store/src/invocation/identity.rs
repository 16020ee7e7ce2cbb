//! Which id an invocation gets. Ids carry their partition key, so where an invocation lives
//! follows from its id: an object's invocations share its partition, an idempotency key or a
//! workflow names one id, and every invocation of a scope lives on the scope's partition (where
//! its queues and counters are).

use sluice_core::ids::InvocationId;

/// Stable 64-bit FNV-1a of the parts, each followed by 0xff, so a key maps to the same
/// partition key across restarts and builds.
pub fn partition_key(parts: &[&str]) -> u64 {
    sluice_core::hash::fnv1a_64(
        parts
            .iter()
            .flat_map(|part| part.bytes().chain(std::iter::once(0xff))),
    )
}

/// The partition key of an invocation of `service`/`handler` (keyed: of the object).
pub fn target_partition_key(service: &str, handler: &str, key: Option<&str>) -> u64 {
    match key {
        Some(key) => partition_key(&[service, key]),
        None => partition_key(&[service, handler]),
    }
}

/// The invocation an idempotency key stands for (from the ingress or a handler's call).
/// Keyed targets stay on their object's partition; others hash the key in.
pub fn idempotent_id(
    scope: Option<&str>,
    service: &str,
    key: Option<&str>,
    handler: &str,
    idempotency_key: &str,
) -> InvocationId {
    let partition = match key {
        Some(key) => partition_key(&[service, key]),
        None => partition_key(&[service, handler, idempotency_key]),
    };
    InvocationId::idempotent(partition, scope, service, key, handler, idempotency_key)
}

/// `id` moved onto its scope's partition: every invocation of a scope lives where the scope's
/// queues and counters are.
pub fn in_scope(id: InvocationId, scope: Option<&str>) -> InvocationId {
    match scope {
        Some(scope) => InvocationId::new(partition_key(&[scope]), id.uuid()),
        None => id,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn partition_keys_are_stable() {
        // Ids on disk carry partition keys: the value may never change.
        assert_eq!(
            super::partition_key(&["Counter", "k1"]),
            0x0db9_e8f9_8791_8bd1
        );
        assert_eq!(
            super::partition_key(&["Counter", "k1"]),
            super::partition_key(&["Counter", "k1"])
        );
        assert_ne!(
            super::partition_key(&["Counter", "k1"]),
            super::partition_key(&["Counter", "k2"])
        );
        assert_ne!(
            super::partition_key(&["ab", "c"]),
            super::partition_key(&["a", "bc"])
        );
    }
}
