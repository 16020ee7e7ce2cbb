//! Recovery: a partition reads its invocations back from the store and continues them
//! (attempts again, re-arms timers), so nothing acknowledged is lost across a restart.
//!
//! At start-up every partition recovers at once from one read of the invocations table: a
//! scanning thread hands each record's bytes, in batches, to the thread recovering its
//! partition, which decodes it, reads its journal and builds its memory. A partition's rows
//! are spread over the whole table (partition `i` owns the ids whose partition key is `i`
//! modulo the count), so a read per partition read every page once per partition; with all
//! partitions moving through the key order together, each page of the table is read once
//! (`docs/perf.md`, recovery, has the profile). The batches in flight are bounded, so recovery
//! never holds more than a few thousand undecoded records, and each batch's held invocations
//! rest before the next batch is decoded.

use std::sync::mpsc;

use super::model::calls;
use super::model::effect::Effect;
use super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_flow::Measure;
use sluice_store::invocation::store::{self, Timer};
use sluice_store::invocation::{InvocationRecord, Status};
use sluice_store::storage::Store;

/// Records handed to a recovering thread at a time.
const BATCH: usize = 1024;
/// Batches queued for a recovering thread before the scan waits for it.
const BATCHES_IN_FLIGHT: usize = 4;

/// What recovery has gathered so far, run once every record is read (unfinished
/// invocations that only need an attempt are queued as their batch is read).
struct Recovery {
    /// Results completed invocations owe their callers: sent first.
    results: Vec<Effect>,
    /// Wake-ups and children of the unfinished ones.
    rest: Vec<Effect>,
}

impl Partition {
    /// Loads the unfinished invocations `owns` selects and continues them: attempts again,
    /// re-arms timers. Nothing acknowledged is lost. (A cluster takeover: one partition
    /// alone; start-up recovers every partition together with [`recover_all`].)
    pub fn recover(&mut self, owns: impl Fn(InvocationId) -> bool) -> Result<(), CodedError> {
        let (records, timers) = self.outside.store.with_db(|db| {
            Ok::<_, CodedError>((store::load_records_of(db, &owns)?, store::load_timers(db)?))
        })??;
        let mut recovery = self.begin_recovery()?;
        self.recover_records(&mut recovery, records)?;
        let timers = timers.into_iter().filter(|t| owns(t.invocation)).collect();
        self.finish_recovery(recovery, timers);
        Ok(())
    }

    /// Restores what must be in place before anything queues: a paused queue keeps its
    /// entries from the start, and a counter what it used of its quota.
    fn begin_recovery(&mut self) -> Result<Recovery, CodedError> {
        let (paused, uses) = self.outside.store.with_db(|db| {
            let mut uses = Vec::new();
            for m in Measure::ALL {
                let stored = sluice_store::invocation::quotas::load(db, m, self.outside.index)?;
                uses.extend(stored.into_iter().map(|(counter, used)| (m, counter, used)));
            }
            Ok::<_, CodedError>((
                sluice_store::invocation::paused::load(db, self.outside.index)?,
                uses,
            ))
        })??;
        for key in &paused {
            self.admission
                .scheduler
                .pause(key, self.outside.driver.now_ms());
        }
        for (m, counter, used) in uses {
            if !self.admission.scheduler.restore_use(
                m,
                counter.clone(),
                used,
                self.outside.driver.now_ms(),
            ) {
                // Its window ended: the row goes with the next admissions' writes.
                sluice_store::invocation::quotas::forget(
                    &mut self.starting.pins,
                    m,
                    self.outside.index,
                    &counter,
                );
            }
        }
        Ok(Recovery {
            results: Vec::new(),
            rest: Vec::new(),
        })
    }

    /// Takes back `records` (this partition's, in key order): the unfinished ones with their
    /// journals, in one read transaction.
    fn recover_records(
        &mut self,
        recovery: &mut Recovery,
        records: Vec<InvocationRecord>,
    ) -> Result<(), CodedError> {
        // Invocations queue below: under the rule book of now.
        self.refresh_rules();
        let (completed, unfinished): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|record| record.status == Status::Completed);
        for record in completed {
            // Its caller may not have the result yet; callers ignore repeats.
            if let (Some(caller), Some(outcome)) = (record.caller, record.outcome) {
                recovery.results.push(Effect::CallResult(caller, outcome));
            }
            // Completed invocations stay in the store, retained results too.
        }
        let ids: Vec<InvocationId> = unfinished.iter().map(|record| record.id).collect();
        let journals = self
            .outside
            .store
            .with_db(|db| store::load_journals(db, &ids))??;
        let mut to_attempt = Vec::with_capacity(ids.len());
        for (record, journal) in unfinished.into_iter().zip(journals) {
            let id = record.id;
            // A child may have been lost between this journal's commit and its hand-over.
            let now = self.outside.driver.now_ms();
            for child in calls::children_in(
                &self.outside.registry,
                self.outside.config.flow.inherit_scope,
                &record,
                &journal,
                now,
            ) {
                recovery.rest.push(Effect::Child(Box::new(child)));
            }
            let attempt = match (record.status, record.run_at_ms) {
                (Status::Scheduled | Status::BackingOff, Some(at)) => {
                    recovery.rest.push(Effect::WakeAt(id, at, None));
                    // The run of a burst of debounced calls: a new call finds it again.
                    if let Some(burst) = &record.debounce {
                        self.admission.debounced.insert(burst.key.clone(), id);
                    }
                    false
                }
                (Status::Paused, _) => false,
                _ => true,
            };
            let protocol = record.protocol;
            if matches!(
                record.status,
                Status::Suspended | Status::BackingOff | Status::Paused
            ) {
                // Its journal rests again once recovery is stored.
                self.journals_to_rest.push(id);
            }
            self.track_recovered(record, journal, protocol);
            self.reclaim_lock(id);
            if attempt {
                to_attempt.push(id);
            }
        }
        self.observe();
        // Queued now, in key order as an `Effect::Attempt` would queue them. Nothing is
        // admitted before `finish_recovery`'s dispatch, so every started invocation has
        // reclaimed its object's lock by then, whichever batch it came in.
        for id in to_attempt {
            self.enqueue(id);
        }
        self.observe();
        // Held invocations rest before the next batch: recovery's memory stays one batch of
        // live invocations, not every held one (`docs/perf.md`, recovery).
        self.rest_waiting();
        self.observe();
        Ok(())
    }

    /// Re-arms `timers` (this partition's) and runs what recovery gathered.
    fn finish_recovery(&mut self, recovery: Recovery, timers: Vec<Timer>) {
        let Recovery { mut results, rest } = recovery;
        results.extend(rest);
        for timer in timers {
            results.push(Effect::WakeAt(timer.invocation, timer.at_ms, Some(timer)));
        }
        tracing::info!(
            invocations = self.live.len() + self.resting.len(),
            "partition recovered"
        );
        self.observe();
        self.run_effects(results);
    }
}

/// A partition recovered (with what runs beside it), or why not.
type Recovered<E> = Result<(Partition, E), CodedError>;

/// Encoded records of one partition, packed into one buffer. A batch goes back to the scan
/// once its records are decoded and is filled again: the allocator's memory stays with the
/// thread that took it (a buffer per record, freed on another thread, left that memory held
/// by the scanning thread's heap: 0.45 GB of resident memory after recovering 600 k).
#[derive(Default)]
struct Batch {
    /// Its partition's slot on its recovering thread.
    slot: usize,
    /// The records' bytes, one after another.
    bytes: Vec<u8>,
    /// Each record's id and where its bytes end in `bytes`.
    rows: Vec<(InvocationId, usize)>,
}

impl Batch {
    fn push(&mut self, id: InvocationId, raw: &[u8]) {
        self.bytes.extend_from_slice(raw);
        self.rows.push((id, self.bytes.len()));
    }

    /// Each record's id and bytes, in order.
    fn records(&self) -> impl Iterator<Item = (InvocationId, &[u8])> {
        let mut start = 0;
        self.rows.iter().map(move |&(id, end)| {
            let raw = &self.bytes[start..end];
            start = end;
            (id, raw)
        })
    }
}

/// A partition given to a recovering thread: its index, itself, what runs beside it and its
/// timers.
type Given<E> = (usize, Partition, E, Vec<Timer>);

/// One partition on a recovering thread, as it goes.
struct Recovering<E> {
    index: usize,
    partition: Partition,
    extra: E,
    timers: Vec<Timer>,
    state: Result<Recovery, CodedError>,
}

/// Recovers `partitions` (by index, of `n` in all) from `store` at start-up, on as many
/// threads as there are cores, from one read of the invocations table (the module's doc).
/// With `homes` (the shards' runtimes), one thread per shard recovers the shard's partitions
/// (partition `p` on `homes[p % homes.len()]`) inside its runtime, so the attempts and timers
/// recovery starts run on the shard the partition runs on. The first failure, if any.
pub(crate) fn recover_all<E: Send>(
    store: &Store,
    n: usize,
    partitions: Vec<(usize, Partition, E)>,
    homes: &[tokio::runtime::Handle],
) -> Result<Vec<(Partition, E)>, CodedError> {
    recover_all_in_batches(store, n, partitions, homes, BATCH)
}

/// [`recover_all`], handing the records over `batch` at a time (tests take small batches).
pub(crate) fn recover_all_in_batches<E: Send>(
    store: &Store,
    n: usize,
    partitions: Vec<(usize, Partition, E)>,
    homes: &[tokio::runtime::Handle],
    batch: usize,
) -> Result<Vec<(Partition, E)>, CodedError> {
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let partition_of = |id: InvocationId| (id.partition_key() % n as u64) as usize;
    let mut timers: Vec<Vec<Timer>> = (0..n).map(|_| Vec::new()).collect();
    for timer in store.with_db(store::load_timers)?? {
        timers[partition_of(timer.invocation)].push(timer);
    }
    let threads = if homes.is_empty() {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, partitions.len())
    } else {
        homes.len()
    };
    // Where each partition's batches go: its thread and its slot there.
    let mut route: Vec<Option<(usize, usize)>> = vec![None; n];
    let mut groups: Vec<Vec<Given<E>>> = (0..threads).map(|_| Vec::new()).collect();
    for (nth, (index, partition, extra)) in partitions.into_iter().enumerate() {
        let thread = if homes.is_empty() { nth } else { index } % threads;
        route[index] = Some((thread, groups[thread].len()));
        let own = std::mem::take(&mut timers[index]);
        groups[thread].push((index, partition, extra, own));
    }
    // Recovery starts attempts and timers: the threads work inside their shard's runtime, or
    // the caller's.
    let current = tokio::runtime::Handle::try_current().ok();
    let runtime_of = |thread: usize| homes.get(thread).cloned().or_else(|| current.clone());
    let (scanned, mut done) = std::thread::scope(|scope| {
        let (emptied, returned) = mpsc::channel::<Batch>();
        let (senders, workers): (Vec<_>, Vec<_>) = groups
            .into_iter()
            .enumerate()
            .map(|(thread, group)| {
                let (tx, rx) = mpsc::sync_channel::<Batch>(BATCHES_IN_FLIGHT);
                let (runtime, emptied) = (runtime_of(thread), emptied.clone());
                let worker = scope.spawn(move || {
                    let _inside = runtime.as_ref().map(tokio::runtime::Handle::enter);
                    recover_group(group, &rx, &emptied)
                });
                (tx, worker)
            })
            .unzip();
        drop(emptied);
        let mut batches: Vec<Batch> = (0..n).map(|_| Batch::default()).collect();
        let scanned = store.with_db(|db| {
            store::scan_records(db, |id, raw| {
                let index = partition_of(id);
                let Some((thread, slot)) = route[index] else {
                    // Not a partition recovered here.
                    return true;
                };
                let filling = &mut batches[index];
                filling.push(id, raw);
                if filling.rows.len() < batch {
                    return true;
                }
                let mut full = std::mem::replace(filling, returned.try_recv().unwrap_or_default());
                full.slot = slot;
                // A send fails only if the thread is gone (it panicked): its join says so.
                senders[thread].send(full).is_ok()
            })
        });
        for (index, mut last) in batches.into_iter().enumerate() {
            if let (Some((thread, slot)), false) = (route[index], last.rows.is_empty()) {
                last.slot = slot;
                let _ = senders[thread].send(last);
            }
        }
        drop(senders);
        let done: Vec<(usize, Recovered<E>)> = workers
            .into_iter()
            .flat_map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect();
        (scanned, done)
    });
    scanned??;
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, recovered)| recovered).collect()
}

/// One recovering thread: its partitions take the batches `rx` brings until the scan ends,
/// then re-arm their timers and start.
fn recover_group<E>(
    group: Vec<Given<E>>,
    rx: &mpsc::Receiver<Batch>,
    emptied: &mpsc::Sender<Batch>,
) -> Vec<(usize, Recovered<E>)> {
    let mut recovering: Vec<Recovering<E>> = group
        .into_iter()
        .map(|(index, mut partition, extra, timers)| Recovering {
            index,
            state: partition.begin_recovery(),
            partition,
            extra,
            timers,
        })
        .collect();
    for mut batch in rx {
        if let Some(one) = recovering.get_mut(batch.slot)
            // One that failed reads no more of its rows.
            && let Ok(recovery) = &mut one.state
        {
            let records: Result<Vec<InvocationRecord>, CodedError> = batch
                .records()
                .map(|(id, raw)| store::decode_record(id, raw))
                .collect();
            if let Err(e) =
                records.and_then(|records| one.partition.recover_records(recovery, records))
            {
                one.state = Err(e);
            }
        }
        batch.bytes.clear();
        batch.rows.clear();
        // The scan may be over: then the batch is freed here.
        let _ = emptied.send(batch);
    }
    recovering
        .into_iter()
        .map(|mut one| {
            let recovered = one.state.map(|recovery| {
                one.partition.finish_recovery(recovery, one.timers);
                (one.partition, one.extra)
            });
            (one.index, recovered)
        })
        .collect()
}
