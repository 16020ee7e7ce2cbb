//! Harness for black-box tests: starts the real `sluice` binary on free loopback ports with its
//! own temp data dir, waits until both listeners answer, and stops it (SIGKILL) when dropped.

mod binaries;
mod calls;
mod cli;
mod clock;
mod cut;
mod deployments;
mod effects;
mod kafka;
mod kafka_brokers;
mod otlp;
mod sdks;
mod server;

pub use binaries::*;
pub use calls::*;
pub use cli::*;
pub use clock::*;
pub use cut::*;
pub use deployments::*;
pub use effects::*;
pub use kafka::*;
pub use kafka_brokers::*;
pub use otlp::*;
pub use sdks::*;
pub use server::*;
