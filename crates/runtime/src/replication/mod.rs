//! Cluster mode's parts that need no particular log: a partition led here over any
//! `PartitionLog` ([`leader`]), how a replica reads a partition's records ([`follow`]), and how
//! a request reaches the node that leads its partition ([`relay`]). Takeover, the replica
//! reader's loop, the inbox and membership still live with their Kafka provider in
//! `sluice-kafka-log` (see ARCHITECTURE.md, "The layout we are moving to").

pub mod follow;
pub mod leader;
pub mod relay;
