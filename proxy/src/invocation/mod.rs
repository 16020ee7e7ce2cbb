//! Invocations: their durable records, journals and timers.

pub mod record;
pub mod state;
pub mod store;

pub use record::{Failure, InvocationRecord, LastFailure, Outcome, Status, Target};
