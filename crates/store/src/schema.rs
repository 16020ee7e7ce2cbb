//! Every redb table Sluice stores, listed once: its name, its key and value types, and how it
//! travels in cluster mode. The partition log's encoding, the meta topic's snapshots and the
//! reloads after a cluster change all derive from this list, so renaming a table, reordering
//! the list or adding a table cannot silently leave it out of replication: a partition table's
//! number in the log is written here beside it, and a test pins every number.
//!
//! The crates above this one (the registry, the rule book, Kafka subscriptions, plugins) take
//! their table definitions from here instead of naming tables themselves.

use redb::TableDefinition;

/// A table of byte keys and byte values.
pub type BytesTable = TableDefinition<'static, &'static [u8], &'static [u8]>;

/// A table of string keys and byte values.
pub type NamedTable = TableDefinition<'static, &'static str, &'static [u8]>;

/// How a table travels in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Written by a partition's write sets, replicated through the partition log; a log record
    /// names the table by `log_id`. Never change or reuse a number.
    Partition {
        /// Its number in a partition log record.
        log_id: u8,
    },
    /// Cluster-wide metadata, written by whichever node's admin API changed it, published
    /// whole to the meta topic (with the rest of its group) and reloaded by every node.
    Meta(MetaGroup),
    /// This node's own bookkeeping (store format, log positions): never replicated.
    Local,
}

/// Metadata tables that change together and are reloaded together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaGroup {
    /// Deployments and services: the registry.
    Registry,
    /// The flow-control rule book.
    Rules,
    /// Kafka clusters and subscriptions.
    Kafka,
    /// Plugins loaded through the admin API.
    Plugins,
    /// Records of what operators did in bulk (bulk cancels).
    Operations,
}

/// One stored table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    /// Its redb name.
    pub name: &'static str,
    /// How it travels.
    pub role: Role,
}

macro_rules! schema {
    ($( $(#[$doc:meta])* $ident:ident : $ty:ty = $name:literal => $role:expr; )*) => {
        $( $(#[$doc])* pub const $ident: $ty = TableDefinition::new($name); )*

        /// Every table, once.
        pub const TABLES: &[Table] = &[ $( Table { name: $name, role: $role } ),* ];
    };
}

schema! {
    /// Invocation records. Key: invocation id (24 bytes).
    INVOCATIONS: BytesTable = "invocations" => Role::Partition { log_id: 0 };
    /// Key: invocation id (24 bytes) ‖ entry index (u32 BE). Value: type (u16 BE) ‖ payload.
    JOURNAL: BytesTable = "journal" => Role::Partition { log_id: 1 };
    /// Key: wake time (ms, u64 BE) ‖ invocation id ‖ completion id (u32 BE). Value: empty.
    TIMERS: BytesTable = "timers" => Role::Partition { log_id: 2 };
    /// What completed invocations leave behind, and when it goes. Key: purge time (ms, u64
    /// BE) ‖ invocation id ‖ purge kind byte. Value: empty.
    PURGES: BytesTable = "purges" => Role::Partition { log_id: 3 };
    /// Virtual objects' and workflows' state.
    STATE: BytesTable = "state" => Role::Partition { log_id: 4 };
    /// Workflow promises.
    PROMISES: BytesTable = "promises" => Role::Partition { log_id: 5 };
    /// Flow-control queues an operator paused.
    PAUSED_QUEUES: BytesTable = "paused_queues" => Role::Partition { log_id: 6 };
    /// What flow-control counters used of their quotas. Key: partition index (u32 BE) ‖ the
    /// counter's name (`scope[/l1[/l2]]`). Value: window start, window end, used (u64 BE).
    FLOW_QUOTAS: BytesTable = "flow_quotas" => Role::Partition { log_id: 7 };
    /// What flow-control counters' calls spent of their budgets. Key and value as
    /// `flow_quotas`, `used` being the cost charged in the window.
    FLOW_BUDGETS: BytesTable = "flow_budgets" => Role::Partition { log_id: 8 };
    /// How long flow-control counters ran above their concurrency, of their burst budgets. Key
    /// and value as `flow_quotas`, `used` being the ms spent above in the window.
    FLOW_BURSTS: BytesTable = "flow_bursts" => Role::Partition { log_id: 9 };

    /// Registered deployments.
    DEPLOYMENTS: NamedTable = "deployments" => Role::Meta(MetaGroup::Registry);
    /// Services and their revisions.
    SERVICES: NamedTable = "services" => Role::Meta(MetaGroup::Registry);
    /// Flow-control rules, by pattern.
    RULES: NamedTable = "rules" => Role::Meta(MetaGroup::Rules);
    /// The rule book's version.
    RULES_META: NamedTable = "rules_meta" => Role::Meta(MetaGroup::Rules);
    /// Kafka subscriptions.
    SUBSCRIPTIONS: NamedTable = "subscriptions" => Role::Meta(MetaGroup::Kafka);
    /// Kafka clusters subscriptions read from.
    KAFKA_CLUSTERS: NamedTable = "kafka_clusters" => Role::Meta(MetaGroup::Kafka);
    /// Plugins loaded through the admin API: their specs.
    PLUGIN_SPECS: NamedTable = "plugin_specs" => Role::Meta(MetaGroup::Plugins);
    /// Plugins loaded through the admin API: their wasm bytes.
    PLUGIN_BYTES: NamedTable = "plugin_bytes" => Role::Meta(MetaGroup::Plugins);
    /// Flow-control weight overrides. Key: the counter's name (`scope[/l1[/l2]]`). Value: the
    /// weight (u32 BE).
    WEIGHT_OVERRIDES: NamedTable = "weight_overrides" => Role::Meta(MetaGroup::Rules);
    /// Bulk cancels. Key: the bulk cancel's id (`bc_` and a ULID). Value: its record (JSON,
    /// `operations.rs`).
    BULK_CANCELS: NamedTable = "bulk_cancels" => Role::Meta(MetaGroup::Operations);

    /// Store-wide records: the format version and the Sluice version that created the store.
    META: NamedTable = "meta" => Role::Local;
    /// Whether flow control was switched on for this store.
    FLOW_CONTROL: NamedTable = "flow_control" => Role::Local;
    /// Cluster mode: where this node's store is in each partition's log.
    CLUSTER_LOG: BytesTable = "cluster_log" => Role::Local;
    /// Embedded mode: the last record of the local log the store holds (`storage/local/`).
    LOCAL_LOG: BytesTable = "local_log" => Role::Local;
    /// Stored invocations by scope and limit key, kept by the view's applier
    /// (`storage/key_index.rs`). Key: scope and limit key, each after its length (u32 BE) ‖
    /// invocation id. Value: empty.
    INVOCATION_KEYS: BytesTable = "invocation_keys" => Role::Local;
}

/// The table whose role is `role`.
fn with_role(role: Role) -> Option<&'static Table> {
    TABLES.iter().find(|t| t.role == role)
}

/// The partition table a log record names by `log_id`.
pub fn partition_table(log_id: u8) -> Option<BytesTable> {
    with_role(Role::Partition { log_id }).map(|t| TableDefinition::new(t.name))
}

/// The number a log record names partition table `name` by; `None` for other tables.
pub fn log_id(name: &str) -> Option<u8> {
    TABLES.iter().find_map(|t| match t.role {
        Role::Partition { log_id } if t.name == name => Some(log_id),
        _ => None,
    })
}

/// The names of the metadata tables of `group`.
pub fn meta_tables(group: MetaGroup) -> Vec<&'static str> {
    TABLES
        .iter()
        .filter(|t| t.role == Role::Meta(group))
        .map(|t| t.name)
        .collect()
}

/// How many metadata tables there are (a meta record holds at most that many).
pub fn meta_table_count() -> usize {
    TABLES
        .iter()
        .filter(|t| matches!(t.role, Role::Meta(_)))
        .count()
}

/// The metadata table named `name` (a meta topic record names tables by name), with its group.
pub fn meta_table(name: &str) -> Option<(&'static str, MetaGroup)> {
    TABLES.iter().find_map(|t| match t.role {
        Role::Meta(group) if t.name == name => Some((t.name, group)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The numbers are written into every cluster log record and the names into every meta
    /// record: changing one breaks replication between versions. Append, never edit.
    #[test]
    fn the_log_ids_and_names_are_pinned() {
        let partition: Vec<(&str, u8)> = TABLES
            .iter()
            .filter_map(|t| match t.role {
                Role::Partition { log_id } => Some((t.name, log_id)),
                _ => None,
            })
            .collect();
        assert_eq!(
            partition,
            [
                ("invocations", 0),
                ("journal", 1),
                ("timers", 2),
                ("purges", 3),
                ("state", 4),
                ("promises", 5),
                ("paused_queues", 6),
                ("flow_quotas", 7),
                ("flow_budgets", 8),
                ("flow_bursts", 9),
            ]
        );
        let meta: Vec<(&str, MetaGroup)> = TABLES
            .iter()
            .filter_map(|t| match t.role {
                Role::Meta(group) => Some((t.name, group)),
                _ => None,
            })
            .collect();
        assert_eq!(
            meta,
            [
                ("deployments", MetaGroup::Registry),
                ("services", MetaGroup::Registry),
                ("rules", MetaGroup::Rules),
                ("rules_meta", MetaGroup::Rules),
                ("subscriptions", MetaGroup::Kafka),
                ("kafka_clusters", MetaGroup::Kafka),
                ("plugin_specs", MetaGroup::Plugins),
                ("plugin_bytes", MetaGroup::Plugins),
                ("weight_overrides", MetaGroup::Rules),
                ("bulk_cancels", MetaGroup::Operations),
            ]
        );
    }

    #[test]
    fn names_and_log_ids_are_unique_and_resolve_both_ways() {
        let names: HashSet<&str> = TABLES.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), TABLES.len(), "a name is listed twice");
        for t in TABLES {
            match t.role {
                Role::Partition { log_id: id } => {
                    assert_eq!(log_id(t.name), Some(id));
                    let table = partition_table(id).expect("resolves");
                    assert_eq!(redb::TableHandle::name(&table), t.name);
                }
                Role::Meta(group) => {
                    assert_eq!(meta_table(t.name), Some((t.name, group)));
                    assert!(meta_tables(group).contains(&t.name));
                    assert!(log_id(t.name).is_none());
                }
                Role::Local => {
                    assert!(log_id(t.name).is_none() && meta_table(t.name).is_none());
                }
            }
        }
        assert!(partition_table(10).is_none());
    }
}
