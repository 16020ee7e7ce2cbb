//! The world's machinery: starting and crashing the node, delivering events, commits on the
//! simulated disk, and attempts as the SDK model runs them.

use super::*;

impl World {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let mut config = Config::default();
        // Completed invocations leave the store soon, so the purger works while faults happen
        // (and restarts stay quick).
        config.worker.completion_retention = FriendlyDuration::from_secs(20);
        let invoker = &mut config.worker.invoker;
        invoker.concurrent_invocations_limit = NonZeroU32::new(2 + rng.below(8) as u32).unwrap();
        // Half the runs keep no held input in memory: every invocation at rest is then read
        // back from the store alone, record and input (`parts/dormant.rs`, `Kept::Stored`).
        if rng.chance(50) {
            config.worker.held_memory_budget = sluice_config::ByteSize(0);
        }
        invoker.retry_policy = RetryPolicy {
            initial_interval: FriendlyDuration::from_millis(10),
            exponentiation_factor: 2.0,
            max_interval: FriendlyDuration::from_secs(2),
            max_attempts: NonZeroU32::new(6).unwrap(),
            on_max_attempts: OnMaxAttempts::Pause,
        };
        let disk = Disk::default();
        let log = rng.chance(50).then(|| cluster::SimLog::new(&mut rng));
        let mut world = Self {
            rng,
            disk,
            log_disk: LogDisk::default(),
            log,
            fresh_disk: false,
            meta: Default::default(),
            now: Arc::new(AtomicU64::new(EPOCH_MS)),
            outbox: Arc::default(),
            config: Arc::new(config),
            rules: tokio::sync::watch::Sender::new(Arc::new(first_book())),
            s1_limit: None,
            s1_rate: None,
            s1_admitted: VecDeque::new(),
            ever_started: std::collections::BTreeSet::new(),
            node: None,
            inbox: Vec::new(),
            acked: BTreeMap::new(),
            purged: std::collections::BTreeSet::new(),
            s1_purging: Vec::new(),
            s1_retired: 0,
            idempotent: BTreeMap::new(),
            submitted: Vec::new(),
            answered: BTreeMap::new(),
            executions: BTreeMap::new(),
            stats: Stats::default(),
            trace: std::collections::hash_map::DefaultHasher::new(),
        };
        // The deployment is registered once, before the first start.
        world.meta = register(&world.disk);
        world.start();
        world
    }

    pub(super) fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    pub(super) fn node(&mut self) -> &mut Node {
        self.node.as_mut().expect("the node runs")
    }

    /// Starts the process on what the disk holds: the partition recovers from the store. In
    /// cluster mode the store first catches up with the log, under a new epoch (on a fresh
    /// disk when another node takes over).
    pub(super) fn start(&mut self) {
        *self.outbox.lock().unwrap() = Outbox::default();
        if std::mem::take(&mut self.fresh_disk) {
            // Another node: the metadata tables came to it from the meta topic.
            self.disk = Disk::default();
            let store = Store::open_backend(self.disk.backend()).expect("a fresh store");
            store
                .with_db(|db| {
                    let txn = db.begin_write().expect("a write transaction");
                    self.meta.apply(&txn).expect("the metadata applies");
                    txn.commit().expect("the commit");
                })
                .expect("the store is open");
            store.close();
        }
        // Embedded, the store is a view of the local log, replayed as it opens.
        let (store, logged) = if self.log.is_none() {
            let store =
                Store::open_backend_logged(self.disk.backend(), Arc::new(self.log_disk.clone()))
                    .expect("the store reopens and replays its log");
            let store = Arc::new(store);
            let logged = Writer::manual_logged(Arc::clone(&store)).expect("a logged store");
            (store, Some(logged))
        } else {
            let store = Store::open_backend(self.disk.backend()).expect("the store reopens");
            (Arc::new(store), None)
        };
        let registry = Arc::new(Registry::load(Arc::clone(&store)).expect("the registry loads"));
        let (writer, flusher) = match logged {
            Some((writer, flusher)) => (writer, Flush::Logged(Box::new(flusher))),
            None => {
                let (writer, flusher) = Writer::manual_view(Arc::clone(&store));
                (writer, Flush::View(flusher))
            }
        };
        let (writer, leading) = match self.take_over(&store, writer.clone()) {
            Some((staged, leading)) => (staged, Some(leading)),
            None => (writer, None),
        };
        let shared = crate::partition::Shared::new(
            Arc::clone(&store),
            writer,
            registry,
            Arc::clone(&self.config),
        );
        let driver = SimDriver {
            now: Arc::clone(&self.now),
            outbox: Arc::clone(&self.outbox),
        };
        let mut partition = Partition::new(0, &shared, Box::new(driver));
        partition.follow_rules(self.rules.subscribe());
        // As production does: embedded, the start-up's recovery of every partition from one
        // read of the store; a cluster takeover reads its own rows itself.
        let mut partition = if leading.is_some() {
            partition
                .recover(|_| true)
                .expect("the partition recovers from what was committed");
            partition
        } else {
            let mut recovered =
                crate::partition::recovery::recover_all(&store, 1, vec![(0, partition, ())], &[])
                    .expect("the partition recovers from what was committed");
            recovered.remove(0).0
        };
        // As the run loop starts: what recovery's attempts wrote is awaited like a batch.
        let mut pending = VecDeque::new();
        partition.adopt_detached(&mut pending);
        self.node = Some(Node {
            partition,
            flusher,
            leading,
            store,
            pending,
            replies: Vec::new(),
            calls: Vec::new(),
            attaches: Vec::new(),
            attempts: Vec::new(),
        });
        // Nothing acknowledged is missing from the store.
        self.check_acked_are_stored();
        self.collect();
    }

    /// The process dies: memory is gone, and so is every write not yet synced.
    pub(super) fn crash(&mut self) {
        self.stats.crashes += 1;
        self.trace.write_u8(b'X');
        // Attempts this process started and the world had not looked at yet were admitted
        // all the same (their start may be stored): after the restart they resume, taking no
        // new token, so they are not first admissions.
        let started = std::mem::take(&mut self.outbox.lock().unwrap().started);
        self.ever_started.extend(started.iter().map(|s| s.id));
        // Whatever redb would write while closing never reaches the disk.
        self.disk.fail_after(0);
        self.log_disk.fail_after(0);
        if let Some(node) = self.node.take() {
            node.store.close();
            drop(node);
        }
        self.disk.crash();
        // The log's files may have written part of what was not synced, the last write torn.
        let rng = &mut self.rng;
        self.log_disk.crash(|unsynced| {
            let kept = rng.below(unsynced as u64 + 1) as usize;
            (kept, rng.below(96) as usize)
        });
        // What it had handed to the partition log's broker lands, up to a point.
        if let Some(log) = self.log.as_mut() {
            log.crash(&mut self.rng);
        }
        // A restart fills every bucket: the rate's windows start again.
        self.s1_admitted.clear();
        // Requests in flight die with their connections.
        self.inbox.clear();
        self.start();
    }

    /// Hands `events` to the partition. They wait in its channel with others a while (so batches
    /// hold several, as under load) unless `now`.
    pub(super) fn deliver(&mut self, events: Vec<Event>, now: bool) {
        self.inbox.extend(events);
        if now || self.rng.chance(35) {
            self.pump();
        }
    }

    /// Applies what waits and whatever it leads to until the partition is idle; a failed commit
    /// stops the process, which then restarts from the store.
    pub(super) fn pump(&mut self) {
        loop {
            let mut batch = std::mem::take(&mut self.inbox);
            batch.append(&mut std::mem::take(&mut self.outbox.lock().unwrap().posted));
            for event in &batch {
                std::mem::discriminant(event).hash(&mut self.trace);
            }
            // The run loop's own step: a rate token or wake-ups due with the clock, and the
            // events waiting in the channel, applied as one write set.
            let node = self.node();
            let Ok(applied) = node
                .partition
                .step(&mut node.pending, Input::Tick(&mut batch))
            else {
                unreachable!("applying a batch stops nothing: only a failed commit does");
            };
            // What the step started (a rate token came due, or a batch's dispatch) is taken in
            // before anything else happens, as a deployment sees an attempt the moment it
            // starts.
            self.collect();
            let idle = applied == 0;
            if idle && self.node().pending.is_empty() {
                return;
            }
            self.stats.events += applied as u64;
            // Sets wait for their commit a while, as they do behind a slow fsync.
            let hold = !idle && self.node().pending.len() < IN_FLIGHT && self.rng.chance(40);
            if !hold && !self.commit() {
                self.crash();
                return;
            }
            self.collect();
        }
    }

    /// Commits what is queued and runs what the commits release; false when a commit failed.
    pub(super) fn commit(&mut self) -> bool {
        // What started attempts wrote outside a batch is awaited like a batch, as the run
        // loop does.
        if self.log.is_some() {
            // A refused record fails its sets: the loop below stops the node.
            self.through_log();
        }
        let node = self.node.as_mut().expect("the node runs");
        let rng = &mut self.rng;
        // Embedded, the log's stages come each in its own time: appended groups wait for their
        // sync. In both modes the view lags behind what was answered by a few groups, made
        // durable now and then; a crash between loses what it had not synced, and the log
        // gives it back.
        let view = match &mut node.flusher {
            Flush::View(view) => view,
            Flush::Logged(flusher) => {
                flusher.append();
                if rng.chance(85) {
                    flusher.sync();
                }
                flusher.view()
            }
        };
        let lagging = view.lagging();
        let groups = if rng.chance(70) {
            lagging
        } else {
            rng.below(lagging as u64 + 1) as usize
        };
        view.apply(groups, rng.chance(15));
        let node = self.node();
        while let Some((commit, _)) = node.pending.front_mut() {
            let committed = match commit.try_recv() {
                Ok(committed) => committed,
                // Not answered yet (its record waits for its sync or the view): it and every
                // later set wait for the next commit.
                Err(oneshot::error::TryRecvError::Empty) => break,
                Err(oneshot::error::TryRecvError::Closed) => {
                    panic!("a write set's answer was dropped")
                }
            };
            if node
                .partition
                .step(&mut node.pending, Input::Committed(committed))
                .is_err()
            {
                return false;
            }
        }
        // A write that failed after its sets were answered (the view's checkpoint) fails the
        // health all the same: the process exits and restarts from the log, as the server does.
        self.node().store.health().failure().is_none()
    }

    /// Takes in the partition's new attempts and the answers its clients got.
    pub(super) fn collect(&mut self) {
        let started = std::mem::take(&mut self.outbox.lock().unwrap().started);
        for attempt in started {
            self.attempt_started(attempt);
        }
        let replies = std::mem::take(&mut self.node().replies);
        let mut waiting = Vec::new();
        for (id, mut reply) in replies {
            match reply.try_recv() {
                Ok(Ok(created)) => self.acknowledged(id, created),
                Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                Err(oneshot::error::TryRecvError::Empty) => waiting.push((id, reply)),
            }
        }
        self.node().replies = waiting;
        // An attach answered: its outcome is awaited like a call's.
        let attaches = std::mem::take(&mut self.node().attaches);
        for (id, mut attached) in attaches {
            match attached.try_recv() {
                Ok(Ok(outcome)) => self.node().calls.push((id, outcome)),
                Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                Err(oneshot::error::TryRecvError::Empty) => {
                    self.node().attaches.push((id, attached))
                }
            }
        }
        let calls = std::mem::take(&mut self.node().calls);
        let mut waiting = Vec::new();
        for (id, mut outcome) in calls {
            match outcome.try_recv() {
                Ok(outcome) => self.answered(id, outcome),
                Err(oneshot::error::TryRecvError::Closed) => {}
                Err(oneshot::error::TryRecvError::Empty) => waiting.push((id, outcome)),
            }
        }
        self.node().calls = waiting;
    }

    /// A call was answered: from now on its outcome must be in the store.
    fn answered(&mut self, id: InvocationId, outcome: Outcome) {
        id.hash(&mut self.trace);
        let acked = self.acked.get_mut(&id).expect("calls are noted");
        acked.acks += 1;
        if self.purged.contains(&id) {
            // An attach answered from the view while the purge of its retention was on its way
            // to the view (the purger's set lags behind like any other): the outcome was right,
            // and it is gone now as the retention says.
            self.stats.answered += 1;
            return;
        }
        // A read that fails here caught the view up with the log, and the disk failed under
        // it: the process is going (its next commit sees the failed store). The restart's
        // check (`check_acked_are_stored`, and `settle` restarts first) holds the outcome to
        // what the log gives back.
        if let Some(stored) = self.read_store(|db| records::load_record(db, id)) {
            let stored = stored.expect("records read back").and_then(|r| r.outcome);
            assert_eq!(
                stored.as_ref(),
                Some(&outcome),
                "call {id} was answered before its outcome was stored"
            );
        }
        // With its journal.
        if let Some(journal) = self.stored_journal(id) {
            assert!(
                journal
                    .first()
                    .is_some_and(|f| f.ty == MessageType::Input.id()),
                "call {id} was answered, but its journal is not in the store"
            );
        }
        self.answered.insert(id, outcome);
        self.stats.answered += 1;
    }

    /// Reads the store; `None` when the read failed, which only a failed store may do (a read
    /// that catches the view up with the log can meet the simulated disk's failure).
    pub(super) fn read_store<T>(&mut self, read: impl FnOnce(&redb::Database) -> T) -> Option<T> {
        let store = &self.node().store;
        match store.with_db(read) {
            Ok(value) => Some(value),
            Err(e) => {
                assert!(
                    store.health().failure().is_some(),
                    "a read failed while the store is healthy: {e}"
                );
                None
            }
        }
    }

    pub(super) fn acknowledged(&mut self, id: InvocationId, created: bool) {
        self.stats.acked += u64::from(created);
        id.hash(&mut self.trace);
        let acked = self.acked.get_mut(&id).expect("submissions are noted");
        // Purged once its retention was up, an id may be created anew.
        if created && self.purged.remove(&id) {
            acked.created = 0;
            // An attach may have seen the purged run's outcome; the new run has its own.
            self.answered.remove(&id);
        }
        acked.created += u32::from(created);
        acked.acks += 1;
        assert!(
            acked.created <= 1,
            "invocation {id} was acknowledged as created {} times",
            acked.created
        );
    }

    /// Whether attempt `attempt` of `id` is the one the partition runs.
    pub(super) fn current(&self, id: InvocationId, attempt: u32) -> bool {
        let node = self.node.as_ref().expect("the node runs");
        node.partition
            .live
            .get(&id)
            .is_some_and(|live| live.running() && live.attempt == attempt)
    }

    /// A new invocation of `s1` was admitted now: no window may hold more admissions than the
    /// rate and its burst allow.
    fn check_rate(&mut self, rate: sluice_flow::RateLimit) {
        let now = self.now();
        self.s1_admitted.push_back(now);
        while self.s1_admitted.len() > 64 {
            self.s1_admitted.pop_front();
        }
        let interval_us = rate.rate.interval_us();
        for window in [0u64, 100, 1_000, 10_000] {
            let inside = self
                .s1_admitted
                .iter()
                .filter(|t| now.saturating_sub(**t) <= window)
                .count() as u64;
            let bound = u64::from(rate.burst.get()) + (window * 1000).div_ceil(interval_us);
            assert!(
                inside <= bound.min(64),
                "{inside} new invocations of s1 admitted within {window} ms under {} (burst {}), bound {bound}",
                rate.rate,
                rate.burst
            );
        }
    }

    pub(super) fn attempt_started(&mut self, started: Started) {
        self.stats.attempts += 1;
        let Started {
            id,
            attempt,
            request,
            ..
        } = started;
        (id, attempt).hash(&mut self.trace);
        let request = match request {
            Ok(request) => request,
            Err(e) => panic!("attempt of {id} has no deployment: {e}"),
        };
        let node = self.node.as_ref().expect("the node runs");
        // A write of this step failed the store (the log's append, say): the process is going,
        // and what it started is cut off with it.
        let Ok(stored) = node.store.with_db(|db| records::load_record(db, id)) else {
            return;
        };
        let stored = stored.expect("records read back");
        assert!(
            stored
                .as_ref()
                .is_none_or(|r| r.status != Status::Completed),
            "completed invocation {id} runs again"
        );
        // Drop attempts the partition gave up on (paused, killed, superseded).
        let mut attempts = std::mem::take(&mut self.node().attempts);
        attempts.retain(|a| self.current(a.id, a.attempt));
        let target = &request;
        if target.service == "Obj" {
            let other = attempts
                .iter()
                .find(|a| a.request.service == "Obj" && a.request.key == target.key);
            assert!(
                other.is_none(),
                "object {:?} runs {id} while {} holds its lock",
                target.key,
                other.map(|a| a.id).unwrap()
            );
        }
        let limit = self
            .config
            .worker
            .invoker
            .concurrent_invocations_limit
            .get();
        assert!(
            attempts.len() < limit as usize,
            "{} attempts run at once, the invoker allows {limit}",
            attempts.len() + 1
        );
        let first = self.ever_started.insert(id);
        if let (Some("s1"), Some(rate), true) = (
            target.scope.as_ref().map(Scope::as_str),
            self.s1_rate,
            first,
        ) {
            self.check_rate(rate);
        }
        if let (Some("s1"), Some(limit)) = (target.scope.as_ref().map(Scope::as_str), self.s1_limit)
        {
            let in_scope = attempts
                .iter()
                .filter(|a| a.request.scope.as_ref().map(Scope::as_str) == Some("s1"))
                .count();
            assert!(
                in_scope < limit as usize,
                "{} attempts run in scope s1, its rule allows {limit}",
                in_scope + 1
            );
        }
        attempts.push(Running {
            id,
            attempt,
            request,
        });
        self.node().attempts = attempts;
    }

    /// The journal of `id` as the store has it; `None` when the store failed under the read.
    fn stored_journal(&mut self, id: InvocationId) -> Option<Vec<Frame>> {
        self.read_store(|db| records::load_journal(db, id))
            .map(|journal| journal.expect("journals read back"))
    }

    /// A `ctx.run` executes its side effect: never again once its result is journaled.
    pub(super) fn execute(&mut self, id: InvocationId, completion: u32) -> Bytes {
        self.stats.executions += 1;
        // A store failed under the read cannot tell: the process is going, and the side effect
        // runs all the same (as a deployment would while Sluice dies).
        let journal = self.stored_journal(id).unwrap_or_default();
        let journaled = journal.iter().any(|frame| {
            frame.ty == MessageType::RunCompletion.id()
                && crate::partition::journal::has_completion(
                    std::slice::from_ref(frame),
                    completion,
                )
        });
        assert!(
            !journaled,
            "ctx.run {completion} of {id} executes again after its result was journaled"
        );
        let count = self.executions.entry((id, completion)).or_default();
        *count += 1;
        Bytes::from(format!("{id}.{completion}.{count}"))
    }

    /// The deployment runs one attempt to its end, or until a failure cuts it short.
    pub(super) fn progress(&mut self, faults: bool) {
        let running = self.node().attempts.len() as u64;
        if running == 0 {
            return;
        }
        let pick = self.rng.below(running) as usize;
        let running = self.node().attempts.swap_remove(pick);
        if !self.current(running.id, running.attempt) {
            return;
        }
        let (id, attempt) = (running.id, running.attempt);
        let now = self.now();
        let mut executed = Vec::new();
        let turn = sdk::play(&running.request, now, |completion| {
            executed.push(completion);
            Bytes::new()
        })
        .unwrap_or_else(|e| panic!("attempt {attempt} of {id} cannot replay its journal: {e}"));
        // Side effects run (and are checked) in order, as the handler reaches them. A cost
        // report (`k`) is no side effect: it proposes its amount as it is.
        let mut values: HashMap<u32, Bytes> =
            executed.iter().map(|&c| (c, self.execute(id, c))).collect();
        let messages: Vec<Message> = turn
            .messages
            .into_iter()
            .map(|message| match message {
                Message::ProposeRunCompletion(mut proposal)
                    if executed.contains(&proposal.result_completion_id) =>
                {
                    let value = values
                        .remove(&proposal.result_completion_id)
                        .expect("one value per execution");
                    proposal.result =
                        Some(proto::propose_run_completion_message::Result::Value(value));
                    Message::ProposeRunCompletion(proposal)
                }
                other => other,
            })
            .collect();
        let failure = if faults { self.rng.below(100) } else { 100 };
        let cut = if failure < 22 {
            self.rng.below(messages.len() as u64 + 1) as usize
        } else {
            messages.len()
        };
        let mut inbox: Vec<Event> = messages
            .into_iter()
            .take(cut)
            .map(|message| Event::AttemptMessage {
                id,
                attempt,
                message,
                ack: false,
            })
            .collect();
        let result = match failure {
            0..10 => Err(AttemptError {
                error: CodedError::new(Code::RT0010, "simulated connection reset"),
                retry_after: self
                    .rng
                    .chance(30)
                    .then(|| std::time::Duration::from_millis(self.rng.below(3_000))),
                status: None,
                unreachable: self.rng.chance(50),
            }),
            10..20 => Ok(Ending::Failed(proto::ErrorMessage {
                code: 500,
                message: "simulated handler error".into(),
                next_retry_delay: self.rng.chance(30).then(|| self.rng.below(3_000)),
                ..proto::ErrorMessage::default()
            })),
            // The deployment stops answering in the middle: the attempt's end never comes
            // (a crash or a kill takes it away).
            20..22 => return self.deliver(inbox, false),
            _ => Ok(turn.ending),
        };
        // A deployment that could be reached answered the request's head first.
        if !matches!(&result, Err(e) if e.unreachable) {
            inbox.insert(0, Event::AttemptAnswered { id, attempt });
        }
        inbox.push(Event::AttemptDone {
            id,
            attempt,
            result,
        });
        self.deliver(inbox, false);
    }
}

/// Registers the simulator's deployment on the store of `disk`; the metadata tables as they
/// are then (what the meta topic carries to other nodes in a real cluster).
fn register(disk: &Disk) -> sluice_store::storage::meta::MetaSnapshot {
    let store = Arc::new(Store::open_backend(disk.backend()).expect("a fresh store"));
    let registry = Registry::load(Arc::clone(&store)).expect("the registry");
    let found = Discovered {
        manifest: manifest(),
        manifest_version: 3,
        http_version: HttpVersion::Http2,
        sdk_version: None,
    };
    registry
        .register(found, Registration::new("http://127.0.0.1:9080/"), EPOCH_MS)
        .expect("the deployment registers");
    let meta = store
        .with_db(|db| {
            sluice_store::storage::meta::MetaSnapshot::read(
                db,
                &sluice_store::schema::meta_tables(sluice_store::schema::MetaGroup::Registry),
            )
        })
        .expect("the store is open")
        .expect("the metadata reads back");
    store.close();
    meta
}
