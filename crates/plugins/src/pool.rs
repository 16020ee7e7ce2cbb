//! Where plugin calls run: a few threads of their own with a bounded queue in front, so a slow
//! or looping plugin takes those threads and never a shard (which also serves the partitions
//! and every other connection). They are batch threads (`SCHED_BATCH`, as the store's): a call
//! that wakes one waits for a busy shard's slice rather than preempting it. A request hands its call over and awaits the answer; when the
//! queue is full it is refused at once (PLG0011) rather than waiting without bound.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use sluice_core::errors::{Code, CodedError};

/// One call (or a refill of warm instances) to run on a pool thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The pool's threads and the queue in front of them.
#[derive(Debug)]
pub(crate) struct CallPool {
    queue: SyncSender<Job>,
    capacity: usize,
}

impl CallPool {
    /// `threads` threads taking jobs from a queue of `capacity` (at least one of each).
    pub(crate) fn start(threads: usize, capacity: usize) -> Result<Self, CodedError> {
        let (queue, jobs) = std::sync::mpsc::sync_channel::<Job>(capacity.max(1));
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..threads.max(1) {
            let jobs = Arc::clone(&jobs);
            // A batch thread: a plugin call that wakes does not preempt a busy shard.
            sluice_store::storage::threads::try_spawn(&format!("plugin-call-{i}"), move || {
                work(&jobs)
            })
            .map_err(|e| {
                CodedError::new(
                    Code::PLG0011,
                    format!("cannot start a plugin call thread: {e}"),
                )
            })?;
        }
        Ok(Self {
            queue,
            capacity: capacity.max(1),
        })
    }

    /// Queues `job`; PLG0011 (retry after a second) when the queue is full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), CodedError> {
        self.queue.try_send(job).map_err(|e| {
            let why = match e {
                TrySendError::Full(_) => format!(
                    "{} plugin calls are waiting for a plugin thread already (plugin-limits.call-queue): try again shortly",
                    self.capacity
                ),
                TrySendError::Disconnected(_) => "the plugin call threads have stopped".to_owned(),
            };
            CodedError::new(Code::PLG0011, why).retry_after(1)
        })
    }

    /// Queues `job` when there is room, else drops it (for work nobody waits on).
    pub(crate) fn offer(&self, job: Job) {
        let _ = self.queue.try_send(job);
    }
}

/// A pool thread: runs jobs until the pool is dropped. The lock is held only to take a job.
fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.recv()
        };
        match job {
            // A job that panics drops its answer's sender (its caller sees a coded error) and
            // leaves this thread serving the next one.
            Ok(job) => {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                    tracing::error!("a plugin call panicked on its thread");
                }
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn jobs_run_off_the_callers_thread_and_a_full_queue_is_refused_with_plg0011() {
        let pool = CallPool::start(1, 1).unwrap();
        let caller = std::thread::current().id();
        let (ran, ran_on) = mpsc::channel();
        pool.submit(Box::new(move || {
            ran.send(std::thread::current().id()).unwrap()
        }))
        .unwrap();
        assert_ne!(ran_on.recv().unwrap(), caller);

        // The one thread holds until released; the queue takes one more, then refuses.
        let (release, held) = mpsc::channel::<()>();
        let (started, has_started) = mpsc::channel();
        pool.submit(Box::new(move || {
            started.send(()).unwrap();
            let _ = held.recv();
        }))
        .unwrap();
        has_started.recv().unwrap();
        pool.submit(Box::new(|| {})).unwrap();
        let refused = pool.submit(Box::new(|| {})).unwrap_err();
        assert_eq!(refused.code, Some(Code::PLG0011));
        assert_eq!(refused.retry_after_s, Some(1));
        assert!(
            refused.message.contains("plugin-limits.call-queue"),
            "{}",
            refused.message
        );
        release.send(()).unwrap();
    }
}
