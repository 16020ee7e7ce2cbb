//! What the script does at each step: submits, repeats, kills and resumes, rule changes,
//! purges, and the passing of time.

use super::*;

impl World {
    /// A client submits a new invocation, repeats one with an idempotency key, or hands in
    /// again one it submitted before (a Kafka record delivered again after a restart: same id).
    pub(super) fn submit(&mut self) {
        let now = self.now();
        let kind = self.rng.below(10);
        if kind == 0
            && let Some((_, repeat)) = self
                .idempotent
                .iter()
                .nth(self.rng.below(self.idempotent.len() as u64) as usize)
        {
            let repeat = repeat.clone();
            return self.hand_in(repeat);
        }
        if kind == 1 && !self.submitted.is_empty() {
            let again = self.submitted[self.rng.index(self.submitted.len())].clone();
            return self.hand_in(again);
        }
        let (target, scope) = match kind {
            0..=4 => {
                let scope = match self.rng.below(3) {
                    0 => None,
                    1 => Some("s1"),
                    _ => Some("s2"),
                };
                (target("Svc", "run", None), scope)
            }
            5..=7 => {
                let key = OBJECT_KEYS[self.rng.below(OBJECT_KEYS.len() as u64) as usize];
                (target("Obj", "add", Some(key)), None)
            }
            _ => (target("Svc", "run", None), Some("s1")),
        };
        let steps = 1 + self.rng.below(4);
        let mut program = Vec::new();
        for _ in 0..steps {
            let step = match self.rng.below(10) {
                0..=3 => b'r',
                4 => b'k',
                5..=6 => b's',
                7 => b'c',
                _ if target.key.is_some() => b'w',
                _ => b'r',
            };
            program.push(step);
        }
        let idempotency = (kind == 9).then(|| self.rng.below(IDEMPOTENCY_KEYS));
        // Born through the same front door as the ingress's, handlers' and Kafka's invocations;
        // ids that are not idempotent come from the seed (a fresh id would not replay).
        let identity = match idempotency {
            Some(k) => Identity::Idempotent(format!("ik-{k}")),
            None => {
                let partition = self.rng.next_u64();
                let uuid = u128::from(self.rng.next_u64());
                Identity::Derived {
                    uuid,
                    partition: Some(partition),
                }
            }
        };
        let scope = scope.map(|s| Scope::parse(s).expect("the simulator's scopes are valid"));
        let limited = scope.as_ref().is_some_and(|s| s.as_str() == "s1");
        let mut new = NewInvocation::new(target, identity).in_scope(scope, None);
        // Some under the limited scope must start before a deadline: past it in their queue,
        // they are failed (FLO0003) and never start.
        if limited && self.rng.chance(20) {
            new = new.with_deadline(Some(now + self.rng.below(2_000)));
        }
        if idempotency.is_some() {
            new.retention = Some(std::time::Duration::from_secs(24 * 60 * 60));
        }
        // Some sends are delayed.
        if self.rng.chance(15) {
            new.run_at_ms = Some(now + self.rng.below(5_000));
        }
        // Some are calls: their caller waits for the outcome, and nobody else knows their id.
        let call = idempotency.is_none() && new.run_at_ms.is_none() && self.rng.chance(30);
        // Half of them journal nothing: their one write is the outcome's.
        if call && self.rng.chance(50) {
            program.clear();
        }
        let record = new.into_record(now);
        let input = Message::Input(proto::InputCommandMessage {
            headers: Vec::new(),
            value: Some(proto::Value {
                content: Bytes::from(program),
            }),
            name: String::new(),
        })
        .to_frame(false);
        let submission = Submission { record, input };
        if call {
            return self.call(submission);
        }
        if idempotency.is_none() {
            self.submitted.push(submission.clone());
        }
        if let Some(k) = idempotency {
            // The first submission of a key stands for it; later ones repeat it.
            if let Some(first) = self.idempotent.get(&k) {
                return self.hand_in(first.clone());
            }
            self.idempotent.insert(k, submission.clone());
        }
        self.hand_in(submission);
    }

    /// A client submits and is answered once it is stored.
    pub(super) fn hand_in(&mut self, submission: Submission) {
        let (reply, answer) = oneshot::channel();
        self.node().replies.push((submission.record.id, answer));
        self.submit_event(submission, reply, None);
    }

    /// A client calls: it is told nothing until the outcome, so the invocation may be stored
    /// as late as that.
    pub(super) fn call(&mut self, submission: Submission) {
        let (reply, _) = oneshot::channel();
        let (call, outcome) = oneshot::channel();
        self.node().calls.push((submission.record.id, outcome));
        self.submit_event(submission, reply, Some(call));
    }

    fn submit_event(
        &mut self,
        submission: Submission,
        reply: oneshot::Sender<Result<bool, CodedError>>,
        call: Option<oneshot::Sender<Outcome>>,
    ) {
        let Submission { record, input } = submission;
        let program = input_program(&input);
        self.acked.entry(record.id).or_insert_with(|| Acked {
            created: 0,
            acks: 0,
            target: record.target.clone(),
            program,
        });
        self.deliver(
            vec![Event::Submit {
                record: Box::new(record),
                input,
                reply: Some(reply),
                call,
            }],
            false,
        );
    }

    /// An operator kills, pauses, resumes or bulk-cancels an invocation, or a client attaches to
    /// it.
    pub(super) fn control(&mut self) {
        let Some(id) = self
            .acked
            .keys()
            .nth(self.rng.below(self.acked.len() as u64) as usize)
            .copied()
        else {
            return;
        };
        let op = match self.rng.below(13) {
            0..=1 => Control::Kill,
            2..=4 => Control::Pause,
            5..=9 => Control::Resume,
            // A bulk cancel's batch that names it, whatever it is doing.
            12 => {
                let filter = crate::partition::model::bulk::CancelFilter {
                    pending: true,
                    scheduled: true,
                    suspended: true,
                    ..Default::default()
                };
                let (reply, _) = oneshot::channel();
                return self.deliver(
                    vec![Event::CancelBatch {
                        filter: std::sync::Arc::new(filter),
                        batch: vec![id],
                        dry_run: false,
                        reply,
                    }],
                    false,
                );
            }
            // A client attaches to its outcome (the admin API's attach): a waiter on an
            // invocation that may be delayed, queued or at rest.
            _ => {
                let (reply, attached) = oneshot::channel();
                self.node().attaches.push((id, attached));
                return self.deliver(vec![Event::Await { id, reply }], false);
            }
        };
        let (reply, _) = oneshot::channel();
        self.deliver(vec![Event::Control { id, op, reply }], false);
    }

    /// The operator changes the limit of scope `s1`: the book is published (as the rules API
    /// does before it answers) and from that moment every admission must follow it. The
    /// partition is not told; a burst of submissions may come right behind the change, and
    /// attempts the commits release may start before the next batch — each must already be
    /// under the new book (`attempt_started` checks the limit and rate set here).
    pub(super) fn change_rules(&mut self) {
        // Attempts started under the old book are checked under it.
        self.collect();
        let limit = match self.rng.below(4) {
            0 => None,
            n => Some(n as u32),
        };
        // Sometimes a rate too: a few tokens a second, so queues wait for them.
        let rate = match self.rng.below(3) {
            0 => Some(sluice_flow::RateLimit {
                rate: ["5/s", "20/s", "2/100ms"][self.rng.below(3) as usize]
                    .parse()
                    .expect("a valid rate"),
                burst: NonZeroU32::new(1 + self.rng.below(3) as u32).expect("not zero"),
                reject: false,
            }),
            _ => None,
        };
        // Sometimes what a full counter does with a newcomer: the calls it drops, replaces or
        // cancels must each end once, with their outcome stored.
        let on_full = match self.rng.below(8) {
            n @ 0..=3 if limit.is_some() => Some(sluice_flow::OnFull::ALL[n as usize]),
            _ => None,
        };
        let mut book = RuleBook::new();
        let mut rule = s1_rule();
        rule.limit = limit_of(limit);
        rule.rate = rate;
        rule.on_full = on_full;
        // Sometimes a debounce: bursts absorbed or replaced, runs pushed back and recovered.
        rule.debounce = match self.rng.below(6) {
            0 => Some("20ms".parse().expect("a valid debounce")),
            1 => Some("20ms first max 50ms".parse().expect("a valid debounce")),
            _ => None,
        };
        book.apply_batch(&[rule], self.now()).expect("a valid rule");
        self.rules.send_replace(Arc::new(book));
        self.s1_limit = limit;
        self.s1_rate = rate;
        self.s1_admitted.clear();
        match self.rng.below(3) {
            // A burst right behind the answer.
            0 => {
                for _ in 0..1 + self.rng.below(6) {
                    self.submit();
                }
            }
            // Commits that were waiting release their effects first.
            1 => {
                if !self.commit() {
                    return self.crash();
                }
                self.collect();
            }
            _ => {}
        }
        // The run loop wakes on the publication too (raised limits release queued work).
        let node = self.node();
        if node
            .partition
            .step(&mut node.pending, Input::RulesPublished)
            .is_err()
        {
            unreachable!("a dispatch stops nothing: only a failed commit does");
        }
        self.collect();
        self.pump();
    }

    /// The purger removes what completed invocations left, once their retention is up.
    pub(super) fn purge(&mut self) {
        let now = self.now();
        // A read that fails met the simulated disk's failure: the process is going.
        let Some(due) = self.read_store(|db| records::due_purges(db, now, 1_000, |_| true)) else {
            return;
        };
        let due = due.expect("purges read back");
        let mut writes = sluice_store::storage::writer::WriteSet::default();
        for purge in &due {
            let node = self.node();
            let record = node
                .store
                .with_db(|db| records::load_record(db, purge.invocation))
                .expect("the store is open")
                .expect("records read back");
            assert!(
                record
                    .as_ref()
                    .is_none_or(|r| r.status == Status::Completed),
                "the purger removes {} before it completed",
                purge.invocation
            );
            // What it was charged stays counted once it is gone.
            // (A purge written and not stored yet is due again: it is noted once.)
            if purge.what == records::Purge::Invocation
                && let Some(cost) = record.as_ref().map(s1_cost).filter(|c| *c > 0)
                && !self.s1_purging.iter().any(|(p, _)| p == purge)
            {
                self.s1_purging.push((purge.clone(), cost));
            }
            records::apply_purge(&mut writes, purge);
        }
        drop(self.node().partition.outside.writer.commit(writes));
        for purge in due {
            if purge.what == records::Purge::Invocation {
                self.purged.insert(purge.invocation);
            }
        }
        if !self.commit() {
            return self.crash();
        }
        self.pump();
    }

    pub(super) fn advance(&mut self, ms: u64) {
        self.now.fetch_add(ms, Ordering::Relaxed);
        self.pump();
    }

    /// One step of the script.
    pub(super) fn step(&mut self) {
        match self.rng.below(1000) {
            0..150 => self.submit(),
            150..700 => self.progress(true),
            700..880 => {
                let ms = self.rng.below(1_500);
                self.advance(ms);
            }
            880..925 => self.control(),
            925..955 => self.change_rules(),
            955..965 => self.purge(),
            965..967 => self.crash(),
            967..979 => {
                // The disk fails somewhere in the next commits (a full disk, an I/O error).
                // Often: the rarest moves of the transition table (an admitted invocation whose
                // resting journal a failed store cannot give back) need a failed view to meet
                // a queue that still waits behind an attempt Sluice gave up on.
                let after = self.rng.below(40) as u32;
                // Embedded, the local log's files fail as often as the view's.
                if self.log.is_none() && self.rng.chance(50) {
                    self.log_disk.fail_after(after);
                } else {
                    self.disk.fail_after(after);
                }
                self.stats.disk_failures += 1;
            }
            // Cluster mode: another node takes the partition over.
            979..983 => self.hand_over(),
            _ => self.pump(),
        }
    }
}
