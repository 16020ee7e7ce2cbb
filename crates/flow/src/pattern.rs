//! Rule patterns: `scope`, `scope/l1`, `scope/l1/l2`, each component exact or `*`. The depth
//! decides the counter level a rule applies to; the rank (scope exact 4 + L1 exact 2 + L2 exact 1)
//! decides which matching rule wins at that level.

use std::fmt;
use std::str::FromStr;

use super::scope::check_name;

/// The counter level a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// The scope counter.
    Scope,
    /// The `scope/l1` counter.
    L1,
    /// The `scope/l1/l2` counter.
    L2,
}

impl Level {
    /// All levels, shallowest first.
    pub const ALL: [Level; 3] = [Level::Scope, Level::L1, Level::L2];

    /// 0 for scope, 1 for L1, 2 for L2.
    pub const fn index(self) -> usize {
        match self {
            Level::Scope => 0,
            Level::L1 => 1,
            Level::L2 => 2,
        }
    }

    /// The name the admin API and the metrics use: `scope`, `level1`, `level2`.
    pub const fn lower_name(self) -> &'static str {
        match self {
            Level::Scope => "scope",
            Level::L1 => "level1",
            Level::L2 => "level2",
        }
    }

    /// The name used in introspection tables.
    pub const fn as_str(self) -> &'static str {
        match self {
            Level::Scope => "Scope",
            Level::L1 => "Level1",
            Level::L2 => "Level2",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One component of a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// `*`: matches any name.
    Any,
    /// Matches this name only.
    Exact(Box<str>),
}

impl Component {
    /// The name when exact.
    pub fn exact(&self) -> Option<&str> {
        match self {
            Component::Any => None,
            Component::Exact(name) => Some(name),
        }
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            Component::Any => true,
            Component::Exact(exact) => **exact == *name,
        }
    }
}

/// A parsed rule pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RulePattern {
    components: Vec<Component>,
}

/// Why a pattern is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rule pattern '{pattern}': {reason}")]
pub struct PatternError {
    /// The pattern as given.
    pub pattern: String,
    /// The rule it broke.
    pub reason: String,
}

impl RulePattern {
    /// How metrics and the flow history name the rule of a counter: its pattern, `none` for
    /// counters no rule limits.
    pub fn label_of(rule: Option<&RulePattern>) -> String {
        rule.map_or_else(|| "none".to_owned(), ToString::to_string)
    }

    /// Parses `scope[/l1[/l2]]`, each component `*` or a name; one trailing `/` is ignored.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let bad = |reason: String| PatternError {
            pattern: text.to_owned(),
            reason,
        };
        let trimmed = text.strip_suffix('/').unwrap_or(text);
        if trimmed.is_empty() {
            return Err(bad(
                "must not be empty (use scope, scope/l1 or scope/l1/l2, each a name or *)".into(),
            ));
        }
        let parts: Vec<&str> = trimmed.split('/').collect();
        if parts.len() > 3 {
            return Err(bad(format!(
                "at most 3 components (scope/l1/l2), got {}",
                parts.len()
            )));
        }
        let names = ["scope", "level 1", "level 2"];
        let components = parts
            .iter()
            .zip(names)
            .map(|(part, what)| {
                if *part == "*" {
                    return Ok(Component::Any);
                }
                check_name(part)
                    .map(|()| Component::Exact((*part).into()))
                    .map_err(|e| bad(format!("{what} '{part}' {} (or *)", e.rule())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { components })
    }

    /// The counter level this pattern applies to.
    pub fn level(&self) -> Level {
        Level::ALL[self.components.len() - 1]
    }

    /// Specificity at its level: scope exact 4 + L1 exact 2 + L2 exact 1.
    pub fn rank(&self) -> u8 {
        self.components
            .iter()
            .zip([4u8, 2, 1])
            .filter(|(c, _)| matches!(c, Component::Exact(_)))
            .map(|(_, weight)| weight)
            .sum()
    }

    /// Components, scope first.
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    /// Whether the rule applies to the counter `(scope, l1, l2)` of its own level.
    pub fn matches(&self, scope: &str, l1: Option<&str>, l2: Option<&str>) -> bool {
        let names = [Some(scope), l1, l2];
        self.components
            .iter()
            .zip(names)
            .all(|(c, name)| name.is_some_and(|n| c.matches(n)))
    }
}

impl fmt::Display for RulePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.components.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            f.write_str(c.exact().unwrap_or("*"))?;
        }
        Ok(())
    }
}

impl FromStr for RulePattern {
    type Err = PatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl PartialOrd for RulePattern {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RulePattern {
    /// Ordered as their text, which is how listings sort them.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.to_string().cmp(&other.to_string())
    }
}

impl serde::Serialize for RulePattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for RulePattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn p(s: &str) -> RulePattern {
        RulePattern::parse(s).unwrap()
    }

    #[test]
    fn depth_decides_level_and_rank_orders_specificity() {
        assert_eq!(p("*").level(), Level::Scope);
        assert_eq!(p("acme/*").level(), Level::L1);
        assert_eq!(p("acme/gold/eu").level(), Level::L2);
        assert!(p("acme/gold").rank() > p("acme/*").rank());
        assert!(p("acme/*").rank() > p("*/gold").rank());
        assert!(p("*/gold").rank() > p("*/*").rank());
        let l2: Vec<u8> = [
            "s/a/b", "s/a/*", "s/*/b", "s/*/*", "*/a/b", "*/a/*", "*/*/b", "*/*/*",
        ]
        .iter()
        .map(|s| p(s).rank())
        .collect();
        assert_eq!(l2, vec![7, 6, 5, 4, 3, 2, 1, 0]);
    }

    #[test]
    fn matching_only_at_its_depth_inputs() {
        assert!(p("acme/*").matches("acme", Some("gold"), None));
        assert!(!p("acme/*").matches("acme", None, None));
        assert!(p("*/gold").matches("other", Some("gold"), Some("eu")));
        assert!(!p("*/gold").matches("other", Some("silver"), None));
        assert!(p("*").matches("anything", None, None));
        assert!(!p("a/b/c").matches("a", Some("b"), None));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = |s: &str| RulePattern::parse(s).unwrap_err().to_string();
        assert_eq!(
            err(""),
            "invalid rule pattern '': must not be empty (use scope, scope/l1 or scope/l1/l2, each a name or *)"
        );
        assert_eq!(
            err("a/b/c/d"),
            "invalid rule pattern 'a/b/c/d': at most 3 components (scope/l1/l2), got 4"
        );
        assert_eq!(
            err("a/b:c"),
            "invalid rule pattern 'a/b:c': level 1 'b:c' only [a-zA-Z0-9_.-] allowed (or *)"
        );
        assert_eq!(
            err("a//b"),
            "invalid rule pattern 'a//b': level 1 '' must not be empty (or *)"
        );
        assert!(err("ac*").contains("scope 'ac*'"));
        assert_eq!(p("acme/").to_string(), "acme");
    }

    proptest! {
        #[test]
        fn display_round_trips(parts in prop::collection::vec(prop_oneof!["\\*", "[a-z0-9_.-]{1,8}"], 1..=3)) {
            let text = parts.join("/");
            let pattern = RulePattern::parse(&text).unwrap();
            prop_assert_eq!(pattern.to_string(), text);
            prop_assert_eq!(pattern.level().index() + 1, parts.len());
        }

        #[test]
        fn parsing_never_panics(s in "\\PC{0,120}") {
            let _ = RulePattern::parse(&s);
        }
    }
}
