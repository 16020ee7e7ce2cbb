//! The partition's parts that own their fields: each holds its own data behind its own
//! methods and imports nothing of the partition that holds it; the partition's behaviour over a
//! part lives one level up (`waking.rs`, `workflow_promises.rs`), importing the part, never the
//! reverse.

pub mod dormant;
pub mod entries;
pub mod promises;
pub mod resting;
