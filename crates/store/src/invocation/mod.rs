//! Invocations: their durable records, journals and timers.

pub mod identity;
pub mod new;
pub mod paused;
pub mod quotas;
pub mod record;
pub mod state;
pub mod store;

pub use record::{
    Caller, Debounced, Failure, InvocationRecord, LastFailure, ListedRecord, Outcome, OutcomeKind,
    Status, Summary, Target,
};
