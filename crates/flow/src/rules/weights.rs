//! Weight overrides: an operator sets the weight of chosen counters (`acme/gold`) without a
//! rule of their own, and the override beats the weight the matching rule gives them. They
//! belong to the rule book (its version bumps when they change, so every partition re-resolves
//! its counters at once) and are stored and replicated with it.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use super::{Level, Resolved, RuleBook, RuleError, RulePattern};

/// Most weight overrides a book may hold.
pub const MAX_WEIGHT_OVERRIDES: usize = 10_000;

/// One change of a batch: the counter and its new override (`None` removes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightChange {
    /// The counter: a pattern whose components are all names (`acme`, `acme/gold`,
    /// `acme/gold/eu`), no `*`.
    pub counter: RulePattern,
    /// Its weight from now on; `None` gives it back to its rule.
    pub weight: Option<NonZeroU32>,
}

impl RuleBook {
    /// Every override, by counter name.
    pub fn weight_overrides(&self) -> &BTreeMap<String, NonZeroU32> {
        &self.weights
    }

    /// This book with `overrides` (as stored), at its version.
    pub fn with_weight_overrides(
        mut self,
        overrides: impl IntoIterator<Item = (String, NonZeroU32)>,
    ) -> Self {
        self.weights = overrides.into_iter().collect();
        self
    }

    /// Applies every change or none; the version bumps once when something changed.
    pub fn set_weights(&mut self, changes: &[WeightChange]) -> Result<(), RuleError> {
        let mut weights = self.weights.clone();
        for change in changes {
            if change
                .counter
                .components()
                .iter()
                .any(|c| c.exact().is_none())
            {
                return Err(RuleError::NotACounter {
                    pattern: change.counter.to_string(),
                });
            }
            let name = change.counter.to_string();
            match change.weight {
                Some(weight) => {
                    if weights.len() >= MAX_WEIGHT_OVERRIDES && !weights.contains_key(&name) {
                        return Err(RuleError::WeightsFull);
                    }
                    weights.insert(name, weight);
                }
                None => {
                    weights.remove(&name);
                }
            }
        }
        if weights != self.weights {
            self.weights = weights;
            self.version += 1;
        }
        Ok(())
    }

    /// `resolved` with the counter's override, if it has one.
    pub(super) fn overridden(
        &self,
        level: Level,
        scope: &str,
        l1: Option<&str>,
        l2: Option<&str>,
        resolved: Resolved,
    ) -> Resolved {
        if self.weights.is_empty() {
            return resolved;
        }
        let name = match (level, l1, l2) {
            (Level::Scope, ..) => scope.to_owned(),
            (Level::L1, Some(l1), _) => format!("{scope}/{l1}"),
            (Level::L2, Some(l1), Some(l2)) => format!("{scope}/{l1}/{l2}"),
            _ => return resolved,
        };
        match self.weights.get(&name) {
            Some(&weight) => Resolved { weight, ..resolved },
            None => resolved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Limit, Upsert};

    fn change(counter: &str, weight: Option<u32>) -> WeightChange {
        WeightChange {
            counter: counter.parse().unwrap(),
            weight: weight.and_then(NonZeroU32::new),
        }
    }

    #[test]
    fn an_override_beats_the_rules_weight_until_it_is_removed() {
        let mut book = RuleBook::new();
        let mut upsert = Upsert::new(
            "acme/*".parse().unwrap(),
            Limit::Concurrency(NonZeroU32::new(4).unwrap()),
        );
        upsert.weight = NonZeroU32::new(2);
        book.apply_batch(&[upsert], 0).unwrap();
        let weight = |book: &RuleBook, key: &str| {
            book.resolve(Level::L1, "acme", Some(key), None)
                .weight
                .get()
        };
        assert_eq!(weight(&book, "gold"), 2);
        let version = book.version();

        book.set_weights(&[change("acme/gold", Some(5))]).unwrap();
        assert_eq!(book.version(), version + 1);
        assert_eq!(weight(&book, "gold"), 5);
        assert_eq!(weight(&book, "free"), 2, "other keys keep their rule's");
        // The limit is still the rule's.
        assert_eq!(
            book.resolve(Level::L1, "acme", Some("gold"), None).limit,
            Limit::Concurrency(NonZeroU32::new(4).unwrap())
        );
        // A counter no rule matches takes its override too.
        book.set_weights(&[change("other/x", Some(3))]).unwrap();
        assert_eq!(
            book.resolve(Level::L1, "other", Some("x"), None)
                .weight
                .get(),
            3
        );

        // Setting what is already set changes nothing.
        let version = book.version();
        book.set_weights(&[change("acme/gold", Some(5))]).unwrap();
        assert_eq!(book.version(), version);

        book.set_weights(&[change("acme/gold", None)]).unwrap();
        assert_eq!(weight(&book, "gold"), 2);
        assert_eq!(book.weight_overrides().len(), 1);
    }

    #[test]
    fn a_batch_with_a_wildcard_or_past_the_bound_changes_nothing() {
        let mut book = RuleBook::new();
        let refused = book.set_weights(&[change("a/b", Some(2)), change("a/*", Some(2))]);
        assert_eq!(
            refused,
            Err(RuleError::NotACounter {
                pattern: "a/*".into()
            })
        );
        assert!(book.weight_overrides().is_empty());
        assert_eq!(book.version(), 0);

        let mut full = RuleBook::new().with_weight_overrides(
            (0..MAX_WEIGHT_OVERRIDES).map(|n| (format!("s/{n}"), NonZeroU32::MIN)),
        );
        assert_eq!(
            full.set_weights(&[change("s/new", Some(2))]),
            Err(RuleError::WeightsFull)
        );
        // Changing one already there still works.
        full.set_weights(&[change("s/1", Some(2))]).unwrap();
    }
}
