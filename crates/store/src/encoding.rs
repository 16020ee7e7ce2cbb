//! How structured rows and posted events are written: MessagePack with named fields (fields
//! added later read back with their defaults) and `serde_bytes` fields as bytes, never as lists
//! of numbers. JSON, which earlier versions wrote, still reads: a MessagePack map never starts
//! with `{`.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The stored bytes of `value`.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec_named(value).map_err(|e| e.to_string())
}

/// A value from its stored bytes, MessagePack or (written before) JSON.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if bytes.first() == Some(&b'{') {
        return serde_json::from_slice(bytes).map_err(|e| e.to_string());
    }
    rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
}
