//! Threads that must not take a core from a shard: the store's own (the writer, which appends
//! and syncs, and the view's applier) and the plugin call threads.
//!
//! They run under `SCHED_BATCH`: a waking batch thread does not preempt the thread running on
//! its vCPU, it waits for that thread's slice to end or for it to sleep. On a box whose cores
//! the shards keep busy, a write set handed to the writer used to preempt the shard that sent
//! it (and the sync's completion preempted whatever ran when the disk answered); now the
//! writer runs when a vCPU frees up, and the sets sent meanwhile share its next sync. While
//! the shards are CPU-bound, syncs gather; when they idle, the writer runs at once.
//! `docs/perf.md` has the numbers. The batch policy is as fair as the normal one: the threads
//! get their share of CPU, only later.

/// Starts thread `name` running `body` under the batch policy (best effort: where the policy
/// cannot be set, the thread runs under the normal one).
pub(crate) fn spawn(name: &str, body: impl FnOnce() + Send + 'static) {
    try_spawn(name, body).unwrap_or_else(|e| panic!("the {name} thread starts: {e}"));
}

/// [`spawn`], answering the error when the thread cannot start.
pub fn try_spawn(name: &str, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let label = name.to_owned();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Err(error) = schedule_as_batch() {
                tracing::debug!(thread = %label, %error, "runs under the normal scheduling policy");
            }
            body()
        })
        .map(drop)
}

/// Puts the calling thread under `SCHED_BATCH`, keeping its nice value. The crate sets the
/// policy with a nice value from its own 0..=99 scale, where 48 is nice 0; a process started
/// at another nice value keeps the normal policy rather than have its threads' nice changed.
fn schedule_as_batch() -> Result<(), String> {
    use thread_priority::unix::{
        NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
        thread_native_id,
    };
    use thread_priority::{ThreadPriority, ThreadPriorityValue};
    let nice = rustix::process::getpriority_process(None).map_err(|e| e.to_string())?;
    if nice != 0 {
        return Err(format!("the thread runs at nice {nice}"));
    }
    let zero = ThreadPriorityValue::try_from(48u8).map_err(|e| e.to_string())?;
    set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Crossplatform(zero),
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch),
    )
    .map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    /// The thread's nice value and scheduling policy, as the kernel reports them.
    fn nice_and_policy() -> (i64, i64) {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // Fields after the name (which may hold spaces) start at field 3.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        (
            fields[19 - 3].parse().unwrap(),
            fields[41 - 3].parse().unwrap(),
        )
    }

    #[test]
    fn a_store_thread_runs_as_a_batch_thread_at_the_nice_value_it_had() {
        const SCHED_BATCH: i64 = 3;
        let (tx, rx) = std::sync::mpsc::channel();
        let before = nice_and_policy().0;
        super::spawn("sluice-test-batch", move || {
            tx.send(nice_and_policy()).unwrap();
        });
        let (nice, policy) = rx.recv().unwrap();
        assert_eq!(nice, before);
        if before == 0 {
            assert_eq!(policy, SCHED_BATCH);
        } else {
            assert_eq!(policy, 0, "left under the normal policy");
        }
    }
}
