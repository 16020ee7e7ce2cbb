//! Sluice: an ingress proxy with flow control and a durable runtime for Restate-SDK deployments.
//!
//! The binary (`main.rs`) only parses arguments; everything it runs lives here.

pub mod admin;
pub mod cli;
pub mod config;
pub mod deployment_tls;
pub mod discovery;
pub mod health;
pub mod ingress;
pub mod invocation;
pub mod invoker;
pub mod kafka;
pub mod limits;
pub mod logging;
pub mod partition;
pub mod plugins;
pub mod registry;
pub mod server;
pub mod shutdown;
pub mod sql;
pub mod storage;

// The crates below this one, under the paths the rest of the code knows them by.
#[cfg(test)]
use sluice_core::simulation;
pub use sluice_core::{clock, errors, ids};
pub use sluice_flow as flow;
pub use sluice_protocol as protocol;
