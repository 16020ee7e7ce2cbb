//! Cluster mode's parts that need no particular log: a partition led here over any
//! `PartitionLog` ([`leader`]), how a replica reads a partition's records ([`follow`]), what a
//! node knows of each partition and the rules that move it — a record read, a takeover won, a
//! leader stepping down, a partition given up on ([`replica`]) — and how a request reaches the
//! node that leads its partition ([`relay`]). The loops that carry them over Kafka (the replica
//! reader's consumer, the takeover's epoch record, the inbox and membership) live with their
//! provider in `sluice-kafka-log` (see ARCHITECTURE.md, "The layout we are moving to").

pub mod follow;
pub mod leader;
pub mod relay;
pub mod replica;
