//! Sluice's durable runtime: the partitions that admit, run and retry invocations
//! ([`partition`]), the client that runs an attempt on a deployment over the service protocol
//! ([`invoker`]), deployments and their services ([`registry`], [`discovery`]), the rule book
//! service ([`limits`]), the [`node`] that holds them together, and what reaches a partition
//! another node leads ([`replication`]). No listener, no HTTP server
//! framework: the `sluice` crate puts doors in front of this.

pub mod deployment_tls;
pub mod discovery;
pub mod invoker;
pub mod limits;
pub mod node;
pub mod partition;
pub mod quickack;
pub mod registry;
pub mod replication;
pub mod shards;
pub mod spans;
