//! The brokers' side of joining: the cluster's topics made where missing and checked (their
//! partition counts, that they keep every record, that they take this node's largest record)
//! and the group session bounds the brokers allow, before the node joins its group.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{METADATA_TIMEOUT, Settings, join_failed};
use sluice_core::errors::{Code, CodedError};

impl Settings {
    /// Creates the topics if they are missing (where the brokers allow it), then checks that
    /// both have exactly the node's partition count.
    pub(super) fn check_topics(&self, replication: u16) -> Result<(), CodedError> {
        let consumer: BaseConsumer = self
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create a client: {e}")))?;
        for (topic, want) in [
            (&self.log_topic, self.partitions),
            (&self.leaders_topic, self.partitions),
            (&self.inbox_topic, self.partitions),
            (&self.meta_topic, 1),
            (&self.epochs_topic, 1),
            (&self.snapshot_topic, self.partitions),
        ] {
            let count = topic_partitions(&consumer, topic)?;
            let count = match count {
                Some(count) => count,
                None => {
                    self.create_topic(topic, want, replication, self.compacted(topic))?;
                    created_partitions(&consumer, topic)?
                }
            };
            if count != want {
                let why = if want == 1 {
                    "the meta and epochs topics have exactly one".to_owned()
                } else {
                    format!(
                        "worker.partitions is {want}: every node of a cluster runs with the partition count the cluster was created with"
                    )
                };
                return Err(CodedError::new(
                    Code::CLU0002,
                    format!("topic {topic} has {count} partitions but {why}"),
                ));
            }
        }
        Ok(())
    }

    /// Refuses topics the brokers say delete or compact records: the log, the inbox and the
    /// meta topic are the cluster's truth and must keep every record. Brokers that cannot
    /// describe configs (DescribeConfigs unsupported or denied) are refused too, unless
    /// `cluster.allow-unconfirmed-retention` says the operator checked: until the log is
    /// bounded by snapshots, a record deleted before a replica read it stops that partition
    /// for good (CLU0004).
    fn check_retention(&self, describer: &Describer) -> Result<(), CodedError> {
        let unconfirmed = |topic: &str, e: &dyn std::fmt::Display| {
            if self.allow_unconfirmed_retention {
                tracing::warn!(topic, error = %e, "cannot read the topic's retention (cluster.allow-unconfirmed-retention is on): make sure it keeps every record (a gap stops following a partition, CLU0004)");
                Ok(())
            } else {
                Err(join_failed(format!(
                    "cannot confirm that topic {topic} keeps every record (the brokers did not describe its settings: {e}); allow DescribeConfigs on the cluster's topics, or check retention.ms=-1, retention.bytes=-1 and cleanup.policy=delete yourself and set cluster.allow-unconfirmed-retention = true"
                )))
            }
        };
        use rdkafka::admin::ResourceSpecifier;
        let topics = [
            &self.log_topic,
            &self.inbox_topic,
            &self.meta_topic,
            &self.epochs_topic,
            &self.snapshot_topic,
        ];
        let specifiers: Vec<_> = topics
            .iter()
            .map(|topic| ResourceSpecifier::Topic(topic))
            .collect();
        let described = match describer.describe(&specifiers) {
            Ok(described) => described,
            Err(e) => return unconfirmed(&self.log_topic, &e),
        };
        for (topic, result) in topics.iter().zip(described) {
            let config = match result {
                Ok(config) => config,
                Err(e) => {
                    unconfirmed(topic, &format!("{e:?}"))?;
                    continue;
                }
            };
            let setting = |name: &str| config.get(name).and_then(|entry| entry.value.clone());
            let compactable = self.compacted(topic);
            if let Some(problem) = retention_problem(topic, setting, compactable)
                .or_else(|| size_problem(topic, setting, self.max_record))
            {
                return Err(join_failed(problem));
            }
            // A setting the brokers did not list is not taken to keep every record.
            if let Some(key) = unlisted_retention_setting(setting) {
                unconfirmed(topic, &format!("its description does not list {key}"))?;
            }
        }
        Ok(())
    }

    /// Checks the brokers' topic and group settings before this node joins the group (so
    /// before it leads or stands by for any partition); false when it must not join (the
    /// failure is in `health`, which stops the process). With
    /// `cluster.allow-unconfirmed-retention` on, the node joins at once and the check runs
    /// beside it: brokers that cannot describe settings (librdkafka's mock among them) take
    /// their whole request timeout to say so, and the operator said they checked.
    pub(super) fn brokers_checked(&self, health: &Arc<sluice_store::health::Health>) -> bool {
        if !self.allow_unconfirmed_retention {
            return match self.check_brokers() {
                Ok(()) => true,
                Err(e) => {
                    health.fail(e);
                    false
                }
            };
        }
        let beside = {
            let (settings, health) = (self.clone(), Arc::clone(health));
            std::thread::Builder::new()
                .name("sluice-retention-check".into())
                .spawn(move || {
                    if let Err(e) = settings.check_brokers() {
                        health.fail(e);
                    }
                })
        };
        if let Err(e) = beside {
            health.fail(join_failed(format!(
                "cannot check the topics' retention: {e}"
            )));
            return false;
        }
        true
    }

    /// Asks the brokers for the topics' and the group's settings and checks them.
    fn check_brokers(&self) -> Result<(), CodedError> {
        let describer = Describer::new(&self.client)?;
        self.check_retention(&describer)?;
        self.check_session_timeout(&describer)
    }

    /// Refuses a `cluster.session-timeout` the brokers would refuse: they take a group member's
    /// session only within `group.min.session.timeout.ms` and `group.max.session.timeout.ms`,
    /// and a node whose join they refuse never leads anything, saying so only in its log.
    /// Brokers that do not describe their settings (librdkafka's mock) are not asked again.
    fn check_session_timeout(&self, describer: &Describer) -> Result<(), CodedError> {
        use rdkafka::admin::ResourceSpecifier;
        let consumer: BaseConsumer = self
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create a client: {e}")))?;
        let Some(broker) = consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .ok()
            .and_then(|m| m.brokers().first().map(|b| b.id()))
        else {
            return Ok(());
        };
        let described = describer.describe(&[ResourceSpecifier::Broker(broker)]);
        let Some(Ok(config)) = described.ok().and_then(|mut all| all.pop()) else {
            tracing::warn!(
                "the brokers did not describe their group session bounds; cluster.session-timeout is not checked against them"
            );
            return Ok(());
        };
        let ms = |name: &str| {
            config
                .get(name)
                .and_then(|entry| entry.value.as_deref())
                .and_then(|value| value.parse::<u64>().ok())
        };
        let session = u64::try_from(self.session_timeout.as_millis()).unwrap_or(u64::MAX);
        session_problem(
            session,
            ms("group.min.session.timeout.ms"),
            ms("group.max.session.timeout.ms"),
        )
        .map_or(Ok(()), |problem| Err(join_failed(problem)))
    }

    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: u16,
        compacted: bool,
    ) -> Result<(), CodedError> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let batch_bytes = largest_batch(self.max_record).to_string();
        let admin: AdminClient<_> = self
            .client
            .create()
            .map_err(|e| join_failed(format!("cannot create an admin client: {e}")))?;
        let new = NewTopic::new(
            topic,
            i32::try_from(partitions).unwrap_or(i32::MAX),
            TopicReplication::Fixed(i32::from(replication)),
        )
        .set("retention.ms", "-1")
        .set("max.message.bytes", &batch_bytes);
        // The meta and epochs topics keep the newest record of each key; their segments roll
        // hourly so that what a newer record replaced can go (a segment is compacted only once
        // it is no longer the one written to).
        let new = if compacted {
            new.set("cleanup.policy", "compact")
                .set("segment.ms", "3600000")
        } else {
            new.set("cleanup.policy", "delete")
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| join_failed(format!("cannot create topic {topic}: {e}")))?;
        let created = runtime
            .block_on(admin.create_topics([&new], &AdminOptions::new()))
            .map_err(|e| join_failed(format!("cannot create topic {topic}: {e}")))?;
        for result in created {
            if let Err((name, error)) = result
                && error != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
            {
                return Err(join_failed(format!("cannot create topic {name}: {error}")));
            }
        }
        tracing::info!(topic, partitions, replication, "created a cluster topic");
        Ok(())
    }
}

/// One admin client and the runtime its answers come on, for the start-up's questions about
/// the brokers' and topics' settings.
struct Describer {
    admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    runtime: tokio::runtime::Runtime,
}

impl Describer {
    fn new(client: &ClientConfig) -> Result<Self, CodedError> {
        Ok(Self {
            admin: client
                .create()
                .map_err(|e| join_failed(format!("cannot create an admin client: {e}")))?,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| join_failed(format!("cannot read the brokers' settings: {e}")))?,
        })
    }

    fn describe(
        &self,
        resources: &[rdkafka::admin::ResourceSpecifier<'_>],
    ) -> rdkafka::error::KafkaResult<Vec<rdkafka::admin::ConfigResourceResult>> {
        let options = rdkafka::admin::AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        self.runtime
            .block_on(self.admin.describe_configs(resources, &options))
    }
}

/// The partition count of `topic` just created: the brokers answer a creation once their
/// controller took it, and list the topic in their metadata a moment later.
fn created_partitions(consumer: &BaseConsumer, topic: &str) -> Result<u32, CodedError> {
    let deadline = std::time::Instant::now() + METADATA_TIMEOUT;
    loop {
        if let Some(count) = topic_partitions(consumer, topic)? {
            return Ok(count);
        }
        if std::time::Instant::now() > deadline {
            return Err(join_failed(format!(
                "topic {topic} was created but the brokers did not list it within {} s",
                METADATA_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The partition count of `topic`; `None` when it does not exist.
fn topic_partitions(consumer: &BaseConsumer, topic: &str) -> Result<Option<u32>, CodedError> {
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| {
            join_failed(format!(
                "cannot read the metadata of topic {topic}: {e}; check cluster.bootstrap-servers"
            ))
        })?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if found.error().is_some() || found.partitions().is_empty() {
        return Ok(None);
    }
    Ok(Some(
        u32::try_from(found.partitions().len()).unwrap_or(u32::MAX),
    ))
}

/// What a record batch of one record of `max_record` bytes may take beside it (the batch's and
/// the record's headers), with room to spare.
const BATCH_OVERHEAD: usize = 16 * 1024;

/// The `max.message.bytes` a cluster topic needs: a batch holding the largest record Sluice
/// writes (the producers' `batch.size` is at most `max_record`, so a batch of several records
/// is no larger).
fn largest_batch(max_record: usize) -> usize {
    max_record.saturating_add(BATCH_OVERHEAD)
}

/// The producers' `batch.size`: librdkafka's default, but never more than a topic takes.
pub(super) fn batch_size(max_record: usize) -> String {
    max_record.min(1_000_000).to_string()
}

/// Why `topic`'s `max.message.bytes` refuses records this node writes, if it does: the broker
/// would refuse such a record, and its partition's leader could not go on.
fn size_problem(
    topic: &str,
    setting: impl Fn(&str) -> Option<String>,
    max_record: usize,
) -> Option<String> {
    let takes = setting("max.message.bytes")?.trim().parse::<usize>().ok()?;
    let needs = largest_batch(max_record);
    (takes < needs).then(|| {
        format!(
            "topic {topic} takes record batches of at most {takes} bytes (max.message.bytes) but cluster.max-record-bytes is {max_record}, which needs {needs}: raise it with `kafka-configs --alter --entity-type topics --entity-name {topic} --add-config max.message.bytes={needs}`, or lower cluster.max-record-bytes on every node"
        )
    })
}

/// What is wrong with a cluster topic's settings (read through `setting`), if anything: it must
/// keep every record, neither deleted by time or size nor compacted; the meta topic
/// (`compactable`) may be compacted, since each of its records holds whole tables under the key
/// of their group, so the newest record of each group is the group.
fn retention_problem(
    topic: &str,
    setting: impl Fn(&str) -> Option<String>,
    compactable: bool,
) -> Option<String> {
    let policy = if compactable { "compact" } else { "delete" };
    let fix = format!(
        "the cluster's log is its only truth and must keep every record: set it with `kafka-configs --alter --entity-type topics --entity-name {topic} --add-config retention.ms=-1,retention.bytes=-1,cleanup.policy={policy}`"
    );
    for (key, keeps_all) in [("retention.ms", "-1"), ("retention.bytes", "-1")] {
        if let Some(value) = setting(key)
            && value.trim() != keeps_all
        {
            return Some(format!("topic {topic} has {key}={value}; {fix}"));
        }
    }
    if let Some(value) = setting("cleanup.policy")
        && value.trim() != "delete"
        && !(compactable && value.trim() == "compact")
    {
        return Some(format!("topic {topic} has cleanup.policy={value}; {fix}"));
    }
    None
}

/// The first of the settings that decide what a topic keeps that its description (read
/// through `setting`) does not list, if any.
fn unlisted_retention_setting(setting: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    ["retention.ms", "retention.bytes", "cleanup.policy"]
        .into_iter()
        .find(|key| setting(key).is_none())
}

/// Why a session of `session` ms is one the brokers (taking `min..=max` ms) refuse, if it is.
fn session_problem(session: u64, min: Option<u64>, max: Option<u64>) -> Option<String> {
    let (min, max) = (min.unwrap_or(0), max.unwrap_or(u64::MAX));
    (session < min || session > max).then(|| {
        format!(
            "cluster.session-timeout is {session} ms, but the brokers take group sessions of {min} to {max} ms (their group.min.session.timeout.ms and group.max.session.timeout.ms): this node could never join the group that assigns partitions. Set cluster.session-timeout within, or change the brokers' settings"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{retention_problem, session_problem, size_problem, unlisted_retention_setting};

    fn settings<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_session_timeout_outside_the_brokers_bounds_is_refused_naming_both_settings() {
        assert_eq!(session_problem(6_000, Some(6_000), Some(1_800_000)), None);
        assert_eq!(
            session_problem(3_000, None, None),
            None,
            "nothing known, nothing refused"
        );
        let short = session_problem(3_000, Some(6_000), Some(1_800_000)).unwrap();
        assert!(
            short.contains("3000 ms")
                && short.contains("group.min.session.timeout.ms")
                && short.contains("cluster.session-timeout"),
            "{short}"
        );
        assert!(session_problem(2_000_000, Some(6_000), Some(1_800_000)).is_some());
    }

    #[test]
    fn topics_that_keep_every_record_pass() {
        let keeps = [
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
            ("cleanup.policy", "delete"),
        ];
        assert_eq!(retention_problem("s.log", settings(&keeps), false), None);
        assert_eq!(unlisted_retention_setting(settings(&keeps)), None);
        // Settings the brokers did not list are not guessed at: they leave the retention
        // unconfirmed.
        assert_eq!(retention_problem("s.log", settings(&[]), false), None);
        assert_eq!(
            unlisted_retention_setting(settings(&keeps[..2])),
            Some("cleanup.policy")
        );
        assert_eq!(
            unlisted_retention_setting(settings(&[])),
            Some("retention.ms")
        );
    }

    #[test]
    fn retention_by_time_size_or_compaction_is_refused_naming_the_fix() {
        for (key, value) in [
            ("retention.ms", "604800000"),
            ("retention.bytes", "1073741824"),
            ("cleanup.policy", "compact"),
            ("cleanup.policy", "compact,delete"),
        ] {
            let problem = retention_problem("s.log", settings(&[(key, value)]), false)
                .unwrap_or_else(|| panic!("{key}={value} passed"));
            assert!(problem.contains(&format!("{key}={value}")), "{problem}");
            assert!(problem.contains("retention.ms=-1"), "{problem}");
        }
    }

    #[test]
    fn the_meta_topic_alone_may_be_compacted_but_never_deleted_by_time() {
        let compact = [("cleanup.policy", "compact")];
        assert_eq!(retention_problem("s.meta", settings(&compact), true), None);
        assert!(retention_problem("s.log", settings(&compact), false).is_some());
        let both = [("cleanup.policy", "compact,delete")];
        assert!(retention_problem("s.meta", settings(&both), true).is_some());
        let timed = [("retention.ms", "86400000")];
        let problem = retention_problem("s.meta", settings(&timed), true).unwrap();
        assert!(problem.contains("cleanup.policy=compact"), "{problem}");
    }

    #[test]
    fn a_topic_that_takes_smaller_batches_than_the_largest_record_is_refused_naming_the_fix() {
        let mib = 1024 * 1024;
        // The brokers' default (1 MiB and 12 bytes) against the default 8 MiB records.
        let problem = size_problem(
            "s.log",
            settings(&[("max.message.bytes", "1048588")]),
            8 * mib,
        )
        .expect("refused");
        assert!(
            problem.contains("max.message.bytes=8404992")
                && problem.contains("cluster.max-record-bytes"),
            "{problem}"
        );
        let enough = (8 * mib + 16 * 1024).to_string();
        assert_eq!(
            size_problem(
                "s.log",
                settings(&[("max.message.bytes", &enough)]),
                8 * mib
            ),
            None
        );
        assert_eq!(size_problem("s.log", settings(&[]), 8 * mib), None);
    }
}
