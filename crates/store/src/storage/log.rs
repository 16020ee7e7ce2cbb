//! The one interface a partition's records go through on their way to durable: the local
//! segment log of embedded mode (`local/`), a partition of cluster mode's Kafka log topic, and
//! the simulators' logs all implement [`PartitionLog`]. What drives one — embedded's appender
//! thread, a cluster leader's pipeline — does the same job over it: append a group's record,
//! wait for the log to confirm where it landed, hand the group to the view, answer its sets.
//!
//! Reading a log back differs too much between providers to share one call (the local log is
//! replayed once, at open, into the view; a Kafka partition is followed for as long as the node
//! runs, and fenced by epoch): each provider's reader applies [`super::record::Record`]s.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use sluice_core::errors::CodedError;

/// A log that takes one partition's records in order and says, record by record, where each
/// landed. Positions grow by one per record.
pub trait PartitionLog: Send {
    /// Hands `record` to the log, behind every record handed to it before. `Ok` promises
    /// nothing yet: [`PartitionLog::poll_confirm`] says whether, and where, it landed. Waits
    /// while the log cannot take more (a full producer queue), never skips.
    fn append(&mut self, record: &[u8]) -> impl Future<Output = Result<(), CodedError>> + Send;

    /// Confirms the oldest record handed over and not confirmed yet: the position it landed at
    /// once the log holds it durably, or why it did not land (after which nothing more of
    /// this log may be acknowledged). Pending while the log has not answered.
    fn poll_confirm(&mut self, cx: &mut Context<'_>) -> Poll<Result<u64, CodedError>>;

    /// How many records were handed over and are not confirmed yet.
    fn unconfirmed(&self) -> usize;

    /// The view holds every record up to `position` durably: the log may give them up. A log
    /// that keeps its own retention ignores it.
    fn release(&mut self, position: u64) -> Result<(), CodedError>;
}

/// Waits for the log to confirm its oldest unconfirmed record ([`PartitionLog::poll_confirm`]).
pub fn confirm<L: PartitionLog>(log: &mut L) -> impl Future<Output = Result<u64, CodedError>> {
    std::future::poll_fn(move |cx| log.poll_confirm(cx))
}

/// Runs `future` to its end on this thread, parking it while the future waits: how a log is
/// driven from a thread of its own (embedded's appender), where the local log answers at once.
pub fn wait<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_runs_a_future_woken_from_another_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sender = std::thread::spawn(move || tx.send(7u8).unwrap());
        assert_eq!(wait(rx), Ok(7));
        sender.join().unwrap();
    }
}
