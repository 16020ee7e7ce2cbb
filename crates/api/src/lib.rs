//! The admin API's bodies: what the server answers and accepts, and what the CLI reads and
//! sends. Plain data with serde and OpenAPI schemas, so a client builds without the server;
//! the server fills them from its own types (`sluice-admin`).

pub mod deployments;
pub mod invocations;
pub mod kafka;
pub mod limits;
pub mod plugins;
pub mod query;
pub mod services;
pub mod version;
pub mod vqueues;
