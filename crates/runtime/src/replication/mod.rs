//! Cluster mode's parts that need no particular log: how a request reaches the node that leads
//! its partition ([`relay`]). Leadership, reading, the inbox and membership still live with
//! their Kafka provider in `sluice-kafka-log`; they move here once they run
//! over a log interface (see ARCHITECTURE.md, "Target layout").

pub mod relay;
