//! Where Sluice keeps its promises: the redb file and the writer that group-commits to it
//! ([`storage`]), what is stored about an invocation — its record, journal, state, promises and
//! idempotency keys ([`invocation`]) — and the process [`health`] a failed write turns off.
//! Nothing here knows about deployments, HTTP or partitions.

pub mod encoding;
pub mod health;
pub mod invocation;
pub mod operations;
pub mod schema;
pub mod storage;
