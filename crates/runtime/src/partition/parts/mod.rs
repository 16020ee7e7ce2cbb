//! The partition's parts that own their fields: each holds its own data behind its own
//! methods and imports nothing of the partition that holds it; the partition's behaviour over a
//! part lives beside the part's name one level up (`dormant.rs`, `promises.rs`), importing the
//! part, never the reverse.

pub mod dormant;
pub mod promises;
