//! Stable hashing: the same bytes give the same value in every build and process, so what is
//! derived from it (partition keys inside ids on disk, span ids) survives restarts.

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a_64(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_reference_values() {
        assert_eq!(super::fnv1a_64(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a_64(*b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
