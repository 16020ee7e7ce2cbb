//! The cluster's rule book as a service: rules persisted in redb, changed in atomic batches,
//! and handed to every partition the moment a batch commits (no restart, no polling).

pub mod migrate;

use std::sync::{Arc, RwLock};

use redb::{ReadableDatabase, ReadableTable};
use tokio::sync::watch;

use sluice_core::clock::now_ms;
use sluice_core::errors::{Code, CodedError};
use sluice_flow::{
    Delete, Rule, RuleBook, RuleError, RulePattern, RulePolicy, Upsert, WeightChange,
};
use sluice_store::storage::Store;

// `RULES` key: pattern, value: the rule as JSON. `RULES_META` key: "version", value: the book
// version (u32 BE). `WEIGHT_OVERRIDES` key: a counter's name, value: its weight (u32 BE).
use sluice_store::schema::{MetaGroup, RULES, RULES_META, WEIGHT_OVERRIDES};

fn storage(e: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::RT0006, format!("rule store: {e}"))
}

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The batch itself (a precondition, a full book).
    #[error(transparent)]
    Rules(#[from] RuleError),
    /// Storing it failed; nothing changed.
    #[error("{0}")]
    Storage(CodedError),
}

/// The book `store` holds.
fn stored_book(store: &Store) -> Result<RuleBook, CodedError> {
    store.with_db(|db| -> Result<RuleBook, CodedError> {
        let txn = db.begin_read().map_err(storage)?;
        let Ok(table) = txn.open_table(RULES) else {
            return Ok(RuleBook::new());
        };
        let mut rules = Vec::new();
        for row in table.iter().map_err(storage)? {
            let (_, value) = row.map_err(storage)?;
            rules.push(serde_json::from_slice::<Rule>(value.value()).map_err(storage)?);
        }
        let version = txn
            .open_table(RULES_META)
            .ok()
            .and_then(|t| t.get("version").ok().flatten())
            .and_then(|v| v.value().try_into().ok())
            .map_or(0, u32::from_be_bytes);
        let mut weights = Vec::new();
        if let Ok(table) = txn.open_table(WEIGHT_OVERRIDES) {
            for row in table.iter().map_err(storage)? {
                let (counter, value) = row.map_err(storage)?;
                // A row that is not a weight (damage) is passed over: the counter keeps its
                // rule's weight.
                let weight = <[u8; 4]>::try_from(value.value())
                    .ok()
                    .and_then(|raw| std::num::NonZeroU32::new(u32::from_be_bytes(raw)));
                if let Some(weight) = weight {
                    weights.push((counter.value().to_owned(), weight));
                }
            }
        }
        Ok(RuleBook::restore(rules, version).with_weight_overrides(weights))
    })?
}

/// The rule book, shared.
#[derive(Debug)]
pub struct Rules {
    store: Arc<Store>,
    book: RwLock<Arc<RuleBook>>,
    changes: watch::Sender<Arc<RuleBook>>,
}

impl Rules {
    /// Loads the stored book.
    pub fn load(store: Arc<Store>) -> Result<Self, CodedError> {
        let book = Arc::new(stored_book(&store)?);
        let (changes, _) = watch::channel(Arc::clone(&book));
        Ok(Self {
            store,
            book: RwLock::new(book),
            changes,
        })
    }

    /// Takes the book the store holds now (cluster mode: another node changed it), keeping the
    /// match policy; partitions get it at once.
    pub fn reload(&self) -> Result<(), CodedError> {
        let stored = stored_book(&self.store)?;
        let mut guard = self.book.write().unwrap_or_else(|e| e.into_inner());
        let next = Arc::new(stored.with_policy(guard.policy().cloned()));
        *guard = Arc::clone(&next);
        self.changes.send_replace(next);
        Ok(())
    }

    /// The current book.
    pub fn book(&self) -> Arc<RuleBook> {
        Arc::clone(&self.book.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Every later book, as it commits.
    pub fn subscribe(&self) -> watch::Receiver<Arc<RuleBook>> {
        self.changes.subscribe()
    }

    /// Lets `policy` decide how rules match from now on (`None`: the most specific rule
    /// wins). Every partition re-resolves its counters at once.
    pub fn set_policy(&self, policy: Option<Arc<dyn RulePolicy>>) {
        let mut guard = self.book.write().unwrap_or_else(|e| e.into_inner());
        let next = Arc::new(guard.with_policy(policy));
        *guard = Arc::clone(&next);
        self.changes.send_replace(next);
    }

    /// Applies upserts atomically; answers the resulting rules in order.
    pub fn upsert(&self, upserts: &[Upsert]) -> Result<Vec<Rule>, RulesError> {
        self.change(|book| book.apply_batch(upserts, now_ms()))
    }

    /// Sets or removes weight overrides atomically; answers every override after.
    pub fn set_weights(
        &self,
        changes: &[WeightChange],
    ) -> Result<std::collections::BTreeMap<String, std::num::NonZeroU32>, RulesError> {
        self.change(|book| {
            book.set_weights(changes)?;
            Ok(book.weight_overrides().clone())
        })
    }

    /// Deletes rules atomically; answers the patterns removed.
    pub fn delete(&self, deletes: &[Delete]) -> Result<Vec<RulePattern>, RulesError> {
        self.change(|book| book.delete_batch(deletes))
    }

    /// Applies upserts and then deletes as one change: all of it or, when a precondition or
    /// expected version fails, none of it.
    pub fn apply(
        &self,
        upserts: &[Upsert],
        deletes: &[Delete],
    ) -> Result<(Vec<Rule>, Vec<RulePattern>), RulesError> {
        self.change(|book| {
            let rules = book.apply_batch(upserts, now_ms())?;
            let removed = book.delete_batch(deletes)?;
            Ok((rules, removed))
        })
    }

    fn change<T>(
        &self,
        apply: impl FnOnce(&mut RuleBook) -> Result<T, RuleError>,
    ) -> Result<T, RulesError> {
        let mut guard = self.book.write().unwrap_or_else(|e| e.into_inner());
        let mut next = RuleBook::clone(&guard);
        let answer = apply(&mut next)?;
        if next.version() == guard.version() {
            return Ok(answer);
        }
        // Cluster mode: every node takes the new book (nothing embedded).
        let change = self.store.meta_change(MetaGroup::Rules);
        self.persist(&guard, &next).map_err(RulesError::Storage)?;
        let next = Arc::new(next);
        *guard = Arc::clone(&next);
        self.changes.send_replace(next);
        drop(guard);
        change.publish().map_err(RulesError::Storage)?;
        Ok(answer)
    }

    /// Writes the difference between two books in one transaction.
    fn persist(&self, before: &RuleBook, after: &RuleBook) -> Result<(), CodedError> {
        self.store.with_db(|db| -> Result<(), CodedError> {
            let txn = db.begin_write().map_err(storage)?;
            {
                let mut table = txn.open_table(RULES).map_err(storage)?;
                for gone in before.rules().filter(|r| after.get(&r.pattern).is_none()) {
                    table
                        .remove(gone.pattern.to_string().as_str())
                        .map_err(storage)?;
                }
                for rule in after.rules() {
                    if before.get(&rule.pattern) != Some(rule) {
                        let json = serde_json::to_vec(rule).map_err(storage)?;
                        table
                            .insert(rule.pattern.to_string().as_str(), json.as_slice())
                            .map_err(storage)?;
                    }
                }
                let mut weights = txn.open_table(WEIGHT_OVERRIDES).map_err(storage)?;
                let (was, is) = (before.weight_overrides(), after.weight_overrides());
                for gone in was.keys().filter(|counter| !is.contains_key(*counter)) {
                    weights.remove(gone.as_str()).map_err(storage)?;
                }
                for (counter, weight) in is.iter().filter(|(c, w)| was.get(*c) != Some(*w)) {
                    weights
                        .insert(counter.as_str(), weight.get().to_be_bytes().as_slice())
                        .map_err(storage)?;
                }
                let mut meta = txn.open_table(RULES_META).map_err(storage)?;
                meta.insert("version", after.version().to_be_bytes().as_slice())
                    .map_err(storage)?;
            }
            txn.commit().map_err(storage)
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_flow::{Limit, Precondition};

    #[test]
    fn weight_overrides_persist_reach_subscribers_and_go_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let rules = Rules::load(Arc::clone(&store)).unwrap();
        let mut changes = rules.subscribe();
        let gold = |weight: Option<u32>| WeightChange {
            counter: "acme/gold".parse().unwrap(),
            weight: weight.and_then(std::num::NonZeroU32::new),
        };
        let set = rules.set_weights(&[gold(Some(4))]).unwrap();
        assert_eq!(set.get("acme/gold").map(|w| w.get()), Some(4));
        assert!(changes.has_changed().unwrap());
        let weight = |book: &RuleBook| {
            book.resolve(sluice_flow::Level::L1, "acme", Some("gold"), None)
                .weight
                .get()
        };
        assert_eq!(weight(&changes.borrow_and_update()), 4);
        // A restart reads them back.
        assert_eq!(weight(&Rules::load(Arc::clone(&store)).unwrap().book()), 4);
        rules.set_weights(&[gold(None)]).unwrap();
        let reloaded = Rules::load(Arc::clone(&store)).unwrap().book();
        assert!(reloaded.weight_overrides().is_empty());
        assert_eq!(weight(&reloaded), 1);
    }

    #[test]
    fn batches_persist_and_reach_subscribers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let rules = Rules::load(Arc::clone(&store)).unwrap();
        let mut changes = rules.subscribe();
        let star: RulePattern = "*".parse().unwrap();
        let limit = Limit::Concurrency(2.try_into().unwrap());
        rules.upsert(&[Upsert::new(star.clone(), limit)]).unwrap();
        assert!(changes.has_changed().unwrap());
        assert_eq!(changes.borrow_and_update().get(&star).unwrap().limit, limit);
        // A failed precondition changes nothing.
        let mut refused = Upsert::new(star.clone(), Limit::Unlimited);
        refused.precondition = Precondition::DoesNotExist;
        assert!(matches!(
            rules.upsert(&[refused]),
            Err(RulesError::Rules(_))
        ));
        assert!(!changes.has_changed().unwrap());
        let version = rules.book().version();
        drop(rules);
        let again = Rules::load(store).unwrap();
        assert_eq!(again.book().version(), version);
        assert_eq!(again.book().get(&star).unwrap().limit, limit);
        again
            .delete(&[Delete {
                pattern: star.clone(),
                expected_version: None,
            }])
            .unwrap();
        assert!(again.book().get(&star).is_none());
    }

    #[test]
    fn an_apply_is_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let rules = Rules::load(Arc::clone(&store)).unwrap();
        let (a, b): (RulePattern, RulePattern) = ("a".parse().unwrap(), "b".parse().unwrap());
        rules
            .upsert(&[Upsert::new(a.clone(), Limit::Unlimited)])
            .unwrap();
        let version = rules.book().version();
        // The delete's expected version is wrong: the upsert of `b` does not happen either.
        let refused = rules.apply(
            &[Upsert::new(b.clone(), Limit::Unlimited)],
            &[Delete {
                pattern: a.clone(),
                expected_version: Some(99),
            }],
        );
        assert!(matches!(refused, Err(RulesError::Rules(_))));
        assert_eq!(rules.book().version(), version);
        assert!(rules.book().get(&b).is_none());
        let (created, removed) = rules
            .apply(
                &[Upsert::new(b.clone(), Limit::Unlimited)],
                &[Delete {
                    pattern: a.clone(),
                    expected_version: None,
                }],
            )
            .unwrap();
        assert_eq!((created.len(), removed), (1, vec![a.clone()]));
        drop(rules);
        let again = Rules::load(store).unwrap();
        assert!(again.book().get(&a).is_none() && again.book().get(&b).is_some());
    }
}
