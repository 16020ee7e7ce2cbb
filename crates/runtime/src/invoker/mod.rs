//! The invoker: runs attempts of invocations against their deployments.

pub mod attempt;
mod body;
mod connections;

pub use attempt::{
    Attempt, AttemptClient, AttemptError, AttemptRequest, Ending, MessageSink, Outbound,
};
