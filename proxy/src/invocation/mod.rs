//! Invocations: their durable records, journals and timers.

pub mod record;
pub mod state;
pub mod store;

pub use record::{Caller, Failure, InvocationRecord, LastFailure, Outcome, Status, Target};
