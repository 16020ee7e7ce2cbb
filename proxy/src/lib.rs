//! Sluice: an ingress proxy with flow control and a durable runtime for Restate-SDK deployments.
//!
//! The binary (`main.rs`) only parses arguments; everything it runs lives here.

pub mod cli;
pub mod cluster;
pub mod ingress;
pub mod logging;
pub mod otlp;
pub mod server;
pub mod services;
pub mod shutdown;

// The crates below this one, under the paths the rest of the code knows them by.
pub use sluice_config as config;
pub use sluice_core::{clock, errors, ids};
pub use sluice_flow as flow;
pub use sluice_protocol as protocol;
pub use sluice_runtime::{
    deployment_tls, discovery, invoker, limits, node, partition, registry, spans,
};
pub use sluice_store::{health, invocation, schema, storage};
