//! Sluice: an ingress proxy with flow control and a durable runtime for Restate-SDK deployments.
//!
//! The binary (`main.rs`) only parses arguments; everything it runs lives here.

pub mod cli;
pub mod logging;
pub mod otlp;
pub mod server;
pub mod services;
pub mod shutdown;
