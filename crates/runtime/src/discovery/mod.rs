//! Discovery: fetching and validating the endpoint manifest of a deployment.

pub mod address;
pub mod client;
mod excerpt;
pub mod manifest;

pub use client::{Discovered, DiscoveryClient, DiscoveryRequest, HttpVersion};
pub use manifest::{HandlerType, Manifest, ProtocolMode, ServiceType};
