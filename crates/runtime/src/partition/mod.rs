//! A partition: one task that owns the state machine of its invocations. Events arrive on a
//! channel; each batch of events becomes one write set for the store's writer (which commits the
//! sets of every partition together), and acknowledgements, attempts and timers are released
//! only after that commit. The partition keeps applying new events while earlier sets commit.

pub mod admission;
mod attempts;
mod charges;
mod commands;
mod crowds;
mod debounce;
pub mod driver;
mod ending;
mod handle;
mod journal;
mod live;
pub mod model;
pub mod parts;
pub mod placement;
pub mod posted;
mod purge;
mod queries;
mod recovery;
mod run_loop;
mod service_metrics;
#[cfg(test)]
mod sim;
pub mod spawning;
mod suspended;
mod task;
mod waking;
mod workflow_promises;

pub use handle::{Receivers, Runtime};
pub use model::answer::Peek;
pub use model::events::{Event, HeldLock, PartitionMetrics, QueuedEntry, StateMemory};
pub use queries::Query;
pub use spawning::{How, Lead, checkpoints};
pub use task::{Partition, Shared};
