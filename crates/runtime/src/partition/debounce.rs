//! A rule's `debounce` (`sluice_flow::rules::Debounce`) at the partition: calls of one target
//! arriving at one counter within the rule's wait of each other make one delayed run, a
//! *burst*. Its run is an ordinary delayed invocation, stored with the burst it stands for
//! (`InvocationRecord::debounce`), so a restart finds the burst again (`recovery.rs` lists
//! them). With `last`, each new call becomes the burst's run and the one it replaces completes
//! with 409 `FLO0009`, never run; with `first`, the burst's first call stays its run, pushed
//! back by each arrival, and each later call completes at once with 409 `FLO0009`. Either way
//! the run starts `wait` after the latest call, at most `max` after the first.

use super::model::effect::Effect;
use super::task::Partition;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::rules::{Debounce, Keep, RuleBook};
use sluice_flow::{Level, LimitKey, Scope};
use sluice_store::invocation::store;
use sluice_store::invocation::{Debounced, InvocationRecord, Status};
use sluice_store::storage::writer::WriteSet;

/// The deepest counter of `(scope, key)` whose rule has a debounce: its name and the debounce.
fn debounce_of(
    book: &RuleBook,
    scope: &Scope,
    key: Option<&LimitKey>,
) -> Option<(String, Debounce)> {
    let (l1, l2) = (key.map(LimitKey::l1), key.and_then(LimitKey::l2));
    [Level::L2, Level::L1, Level::Scope]
        .into_iter()
        .filter(|level| match level {
            Level::L2 => l2.is_some(),
            Level::L1 => l1.is_some(),
            Level::Scope => true,
        })
        .find_map(|level| {
            let debounce = book.resolve(level, scope.as_str(), l1, l2).debounce?;
            let counter = match level {
                Level::Scope => scope.to_string(),
                Level::L1 => format!("{scope}/{}", l1.unwrap_or_default()),
                Level::L2 => format!("{scope}/{}", key.map_or("", LimitKey::as_str)),
            };
            Some((counter, debounce))
        })
}

impl Partition {
    /// A new invocation arriving: under a rule's `debounce` it starts a burst (it becomes a
    /// delayed run), joins one as its new run (`last`: the one it replaces completes), or is
    /// absorbed into the burst's run (`first`: answered `Some(run)`; the caller completes it
    /// with [`Partition::absorb`] once it is created). A call with a delay of its own, or
    /// under no debounce, is left as it is.
    pub(super) fn debounce_arrival(
        &mut self,
        record: &mut InvocationRecord,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<Option<InvocationId>, CodedError> {
        let book = self.admission.scheduler.rules();
        if !book.debounces() || record.run_at_ms.is_some() || record.status != Status::Pending {
            return Ok(None);
        }
        let Some(scope) = &record.scope else {
            return Ok(None);
        };
        let Some((counter, debounce)) = debounce_of(book, scope, record.limit_key.as_ref()) else {
            return Ok(None);
        };
        let target = &record.target;
        let key = format!(
            "{counter} {}/{}/{}",
            target.service,
            target.handler,
            target.key.as_deref().unwrap_or_default()
        );
        let now = self.outside.driver.now_ms();
        let burst = match self.admission.debounced.get(&key).copied() {
            Some(run) => self.burst_of(run, &key, now).map(|since| (run, since)),
            None => None,
        };
        let since = burst.map_or(now, |(_, since)| since);
        match (burst, debounce.keep) {
            (Some((run, _)), Keep::First) => {
                self.push_back(run, debounce.run_at(since, now), writes, effects)?;
                Ok(Some(run))
            }
            (burst, _) => {
                record.status = Status::Scheduled;
                record.run_at_ms = Some(debounce.run_at(since, now));
                record.debounce = Some(Box::new(Debounced {
                    key: key.clone(),
                    since_ms: since,
                }));
                self.admission.debounced.insert(key, record.id);
                if let Some((run, _)) = burst {
                    let error = CodedError::new(
                        Code::FLO0009,
                        format!(
                            "debounced: a newer call ({}) is the run of its burst at counter '{counter}'",
                            record.id
                        ),
                    );
                    self.end_unstarted(run, &error, writes, effects)?;
                }
                Ok(None)
            }
        }
    }

    /// When the burst whose run is `run` began, if `run` still waits for its time under `key`;
    /// else the burst is over and forgotten.
    fn burst_of(&mut self, run: InvocationId, key: &str, now: u64) -> Option<u64> {
        self.rouse(run);
        self.observe();
        let since = self.live.get(&run).and_then(|live| {
            let record = live.record();
            let waits = record.status == Status::Scheduled
                && record.run_at_ms.is_some_and(|at| at > now)
                && !live.started();
            record
                .debounce
                .as_ref()
                .filter(|d| waits && d.key == key)
                .map(|d| d.since_ms)
        });
        if since.is_none() {
            self.admission.debounced.remove(key);
        }
        since
    }

    /// Moves the run `run` of a `first` burst to `at` (stored; the wake-up armed for its old
    /// time finds it not due and does nothing).
    fn push_back(
        &mut self,
        run: InvocationId,
        at: u64,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let Some(live) = self.live.get_mut(&run) else {
            return Ok(());
        };
        live.set_run_at(Some(at));
        store::put_record(writes, live.record())?;
        self.resting.keep_awake(run);
        effects.push(Effect::WakeAt(run, at, None));
        Ok(())
    }

    /// Completes the new invocation `id`, absorbed into the run `into` of a `first` burst.
    pub(super) fn absorb(
        &mut self,
        id: InvocationId,
        into: InvocationId,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let error = CodedError::new(
            Code::FLO0009,
            format!("debounced: the burst's first call ({into}) runs for it"),
        );
        self.end_unstarted(id, &error, writes, effects)
    }

    /// Completes `id`, which never started, with 409 and `error`.
    fn end_unstarted(
        &mut self,
        id: InvocationId,
        error: &CodedError,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        self.scheduler_forget(id);
        let Some(retention) = self
            .live
            .get(&id)
            .map(|live| self.retention(&live.record().target))
        else {
            return Ok(());
        };
        let now = self.outside.driver.now_ms();
        let live = self.live.get_mut(&id).expect("checked live");
        if live.unsaved {
            super::journal::save(live, writes)?;
        }
        super::ending::fail_unstarted(live, 409, error, retention, now, writes, effects)
    }
}
