//! Shards: one thread per core, each running a current-thread tokio runtime that serves the
//! ingress connections it accepted, the partitions it owns (partition `p` on shard
//! `p % shards`) and their deployments' connections (`ARCHITECTURE.md`, "Shards").
//!
//! Why: a call that crosses threads pays a wake of the other thread, and on a virtual machine a
//! wake across vCPUs costs tens of microseconds of CPU (`docs/perf.md`). A fresh call accepted
//! on a shard is placed on one of that shard's partitions (`placement.rs`), so its hand-over to
//! the partition, the attempt's HTTP/2 stream and the answer back are wakes of tasks on the same
//! thread. What still crosses: a call whose partition is fixed by its key or scope (through the
//! partition's channel, as before), and the durable write (the log's own thread).

use std::cell::Cell;
use std::sync::Arc;

use tokio::runtime::Handle;

thread_local! {
    /// The shard this thread is, if it is one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
    /// Turns over the current shard's partitions for new invocations that may live on any.
    static TURN: Cell<usize> = const { Cell::new(0) };
}

/// The running shards. Their threads live as long as the process.
#[derive(Debug)]
pub struct Shards {
    handles: Vec<Handle>,
}

impl Shards {
    /// Starts `n` shards (at least one), each a thread named `sluice-shard-<i>`.
    pub fn start(n: usize) -> std::io::Result<Arc<Self>> {
        let n = n.max(1);
        let mut handles = Vec::with_capacity(n);
        for index in 0..n {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("sluice-shard-{index}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    CURRENT.with(|current| current.set(Some(index)));
                    let _ = tx.send(Ok(runtime.handle().clone()));
                    // The shard's tasks run while the thread waits here; the process ends it.
                    runtime.block_on(std::future::pending::<()>());
                })?;
            let handle = rx
                .recv()
                .map_err(|_| std::io::Error::other("a shard thread ended while starting"))??;
            handles.push(handle);
        }
        Ok(Arc::new(Self { handles }))
    }

    /// How many shards run.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Never: at least one shard runs.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Shard `index`'s runtime.
    pub fn handle(&self, index: usize) -> &Handle {
        &self.handles[index % self.handles.len()]
    }

    /// Every shard's runtime, in order.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// The runtime partition `index` runs on.
    pub fn of_partition(&self, index: usize) -> &Handle {
        self.handle(index)
    }
}

/// The shard the calling thread is, if it is one.
pub fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// The next of `candidates` in this thread's turn (new invocations spread over them).
pub(crate) fn next_turn(candidates: usize) -> usize {
    TURN.with(|turn| {
        let next = turn.get().wrapping_add(1);
        turn.set(next);
        next % candidates.max(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shard_runs_its_tasks_on_its_own_thread_and_knows_which_it_is() {
        let shards = Shards::start(3).expect("shards start");
        assert_eq!(shards.len(), 3);
        assert_eq!(current(), None, "the test's thread is no shard");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for index in 0..5 {
            let (seen, name) =
                runtime
                    .block_on(shards.of_partition(index).spawn(async {
                        (current(), std::thread::current().name().map(str::to_owned))
                    }))
                    .expect("the task ran");
            assert_eq!(seen, Some(index % 3));
            assert_eq!(
                name.as_deref(),
                Some(&*format!("sluice-shard-{}", index % 3))
            );
        }
    }
}
