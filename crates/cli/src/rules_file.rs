//! The rule book as a file (`sluice rules apply -f` / `sluice rules export`): TOML
//! (`[[rules]]` tables) or JSON (`{"rules": [...]}`, chosen by a `.json` name), and the plan
//! that turns the live book into the file's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sluice_api::limits::{
    ApplyRulesRequest, Concurrency, DeleteRuleRequest, Limits, PreconditionRequest, RuleResponse,
    UpsertRuleRequest,
};
use sluice_flow::Rate;

use sluice_core::errors::CodedError;

/// One rule as a file writes it: its pattern, mode, description and switch, and the API's
/// [`Limits`] spelled flat beside them (`concurrency = 4` next to `pattern`). The limits are the
/// API's own type, declared once: a field added to `Limits` is a field of the file, and a
/// field neither knows is refused (`Limits` denies unknown fields; serde's `flatten` would not,
/// so reading splits the rule's own keys off by hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// `*`, `scope`, `scope/l1`, `*/l1/l2`, …
    pub pattern: String,
    /// Its limits (none: unlimited).
    pub limits: Limits,
    /// `enforce` (default) or `shadow`.
    pub mode: Option<String>,
    /// Free text.
    pub description: Option<String>,
    /// Kept but not applied.
    pub disabled: bool,
}

/// How a rule is written: the limits flattened between the pattern and the rest.
#[derive(Serialize)]
struct Written<'a> {
    pattern: &'a str,
    #[serde(flatten)]
    limits: &'a Limits,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: &'a Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    disabled: bool,
}

impl Serialize for RuleSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Written {
            pattern: &self.pattern,
            limits: &self.limits,
            mode: &self.mode,
            description: &self.description,
            disabled: self.disabled,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RuleSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut fields = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        fn field<T: serde::de::DeserializeOwned, E: Error>(
            fields: &mut serde_json::Map<String, serde_json::Value>,
            name: &str,
        ) -> Result<Option<T>, E> {
            fields
                .remove(name)
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| E::custom(format!("{name}: {e}")))
        }
        let pattern: String =
            field(&mut fields, "pattern")?.ok_or_else(|| D::Error::missing_field("pattern"))?;
        let mode = field(&mut fields, "mode")?;
        let description = field(&mut fields, "description")?;
        let disabled = field(&mut fields, "disabled")?.unwrap_or(false);
        let limits = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|e| D::Error::custom(format!("rule '{pattern}': {e}")))?;
        Ok(Self {
            pattern,
            limits,
            mode,
            description,
            disabled,
        })
    }
}

/// A whole file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesFile {
    /// Its rules.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

impl RuleSpec {
    /// The rule as the server would store it: the rate as it reads back, the burst spelled
    /// out, so a file and the live book compare equal when they mean the same.
    fn normalised(&self) -> Result<Self, CodedError> {
        let rule = |why: String| CodedError::uncoded(format!("rule '{}': {why}", self.pattern));
        let limits = &self.limits;
        let rate = match &limits.rate {
            None if limits.burst.is_some() => return Err(rule("burst needs a rate".into())),
            None => None,
            Some(text) => Some(
                text.parse::<Rate>()
                    .map_err(|e| rule(e.to_string()))?
                    .to_string(),
            ),
        };
        if limits.concurrency.map(Concurrency::max) == Some(0) || limits.burst == Some(0) {
            return Err(rule("concurrency and burst must be at least 1".into()));
        }
        let on_exceed = limits.on_exceed.clone().filter(|o| o != "throttle");
        // As the server reads it back: `30000ms` is `30s`.
        let max_wait = match &limits.max_wait {
            None => None,
            Some(text) => Some(
                text.parse::<sluice_core::units::FriendlyDuration>()
                    .map_err(|e| rule(format!("max_wait {e}")))?
                    .to_string(),
            ),
        };
        // As the server shows it: `10000/d` is `10000/day`.
        let quota = match &limits.quota {
            None => None,
            Some(text) => Some(
                text.parse::<sluice_flow::Quota>()
                    .map_err(|e| rule(e.to_string()))?
                    .to_string(),
            ),
        };
        // As the server shows it: `5000/minute` is `5000/min`.
        let budget = match &limits.budget {
            None => None,
            Some(text) => Some(
                text.parse::<sluice_flow::Budget>()
                    .map_err(|e| rule(e.to_string()))?
                    .to_string(),
            ),
        };
        // As the server shows it: `2s last` is `2s`.
        let debounce = match &limits.debounce {
            None => None,
            Some(text) => Some(
                text.parse::<sluice_flow::Debounce>()
                    .map_err(|e| rule(e.to_string()))?
                    .to_string(),
            ),
        };
        if let Some(mode) = self
            .mode
            .as_deref()
            .filter(|m| !matches!(*m, "enforce" | "shadow"))
        {
            return Err(rule(format!("mode is 'enforce' or 'shadow', not '{mode}'")));
        }
        Ok(Self {
            limits: Limits {
                burst: rate.as_ref().map(|_| limits.burst.unwrap_or(1)),
                rate,
                on_exceed,
                max_wait,
                quota,
                budget,
                weight: limits.weight.filter(|w| *w != 1),
                // `queue` is the default the server leaves out.
                on_full: limits.on_full.clone().filter(|o| o.trim() != "queue"),
                debounce,
                ..limits.clone()
            },
            mode: self.mode.clone().filter(|m| m != "enforce"),
            ..self.clone()
        })
    }

    /// A live rule as a file would say it: normalised like a file's rule, so that a default
    /// the server spells out (`weight: 1`, `on_exceed: throttle`, `burst: 1`) compares equal
    /// to the file leaving it out.
    fn of(rule: &RuleResponse) -> Self {
        let spec = Self::as_stored(rule);
        // The server stored it, so it is valid; keep it as it is if not.
        spec.normalised().unwrap_or(spec)
    }

    fn as_stored(rule: &RuleResponse) -> Self {
        Self {
            pattern: rule.pattern.clone(),
            limits: rule.limits.clone(),
            mode: Some(rule.mode.clone()).filter(|m| m != "enforce"),
            description: rule.description.clone(),
            disabled: rule.disabled,
        }
    }

    fn request(&self, precondition: PreconditionRequest) -> UpsertRuleRequest {
        UpsertRuleRequest {
            pattern: self.pattern.clone(),
            limits: self.limits.clone(),
            description: self.description.clone(),
            disabled: self.disabled,
            mode: self.mode.clone(),
            precondition: Some(precondition),
        }
    }

    /// `concurrency=2 rate=10/s burst=1 disabled`, for the plan.
    fn summary(&self) -> String {
        let mut out = Vec::new();
        match self.limits.concurrency {
            Some(c) => out.push(format!("concurrency={c}")),
            None => out.push("concurrency=unlimited".to_owned()),
        }
        if let Some(rate) = &self.limits.rate {
            out.push(format!("rate={rate}"));
            out.push(format!("burst={}", self.limits.burst.unwrap_or(1)));
        }
        if let Some(on_exceed) = &self.limits.on_exceed {
            out.push(format!("on_exceed={on_exceed}"));
        }
        if let Some(max) = self.limits.max_queued {
            out.push(format!("max_queued={max}"));
        }
        if let Some(weight) = self.limits.weight {
            out.push(format!("weight={weight}"));
        }
        if let Some(max_wait) = &self.limits.max_wait {
            out.push(format!("max_wait={max_wait}"));
        }
        if let Some(a) = self.limits.adaptive {
            out.push(format!("adaptive={}..{}", a.min, a.max));
        }
        if let Some(quota) = &self.limits.quota {
            out.push(format!("quota={quota}"));
        }
        if let Some(budget) = &self.limits.budget {
            out.push(format!("budget={budget}"));
        }
        if let Some(reserve) = self.limits.reserve {
            out.push(format!("reserve={reserve}"));
        }
        if let Some(unit) = &self.limits.budget_unit {
            out.push(format!("budget_unit={unit}"));
        }
        if let Some(burst) = &self.limits.burst_budget {
            out.push(format!("burst_budget={burst}"));
        }
        if let Some(on_full) = &self.limits.on_full {
            out.push(format!("on_full={on_full}"));
        }
        if let Some(debounce) = &self.limits.debounce {
            out.push(format!("debounce={debounce}"));
        }
        if let Some(mode) = &self.mode {
            out.push(format!("mode={mode}"));
        }
        if self.disabled {
            out.push("disabled".to_owned());
        }
        if let Some(d) = &self.description {
            out.push(format!("description={d:?}"));
        }
        out.join(" ")
    }
}

/// Reads a rules file: JSON when its name ends in `.json`, TOML otherwise.
pub fn read(path: &Path) -> Result<RulesFile, CodedError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CodedError::uncoded(format!(
            "cannot read the rules file {}: {e}",
            path.display()
        ))
    })?;
    let bad = |e: String| {
        CodedError::uncoded(format!(
            "the rules file {} is not valid: {e}",
            path.display()
        ))
    };
    if is_json(path) {
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
    } else {
        toml::from_str(&text).map_err(|e| bad(e.to_string()))
    }
}

fn is_json(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// The live book in the file format: JSON when `json`, TOML otherwise.
pub fn export(live: &[RuleResponse], json: bool) -> String {
    let file = RulesFile {
        rules: live.iter().map(RuleSpec::of).collect(),
    };
    if json {
        serde_json::to_string_pretty(&file).unwrap_or_default() + "\n"
    } else {
        toml::to_string(&file).unwrap_or_default()
    }
}

/// Whether an export to `path` should be JSON.
pub fn export_as_json(path: Option<&Path>, format: Option<&str>) -> bool {
    match format {
        Some(f) => f.eq_ignore_ascii_case("json"),
        None => path.is_some_and(is_json),
    }
}

/// What an apply changes.
#[derive(Debug, Default)]
pub struct Plan {
    /// Rules to create.
    pub create: Vec<RuleSpec>,
    /// Rules to change: (live version, live rule, wanted rule).
    pub update: Vec<(u32, RuleSpec, RuleSpec)>,
    /// Live rules not in the file, with their versions: deleted with `--prune`.
    pub absent: Vec<(u32, RuleSpec)>,
    /// Rules the file and the live book agree on.
    pub unchanged: Vec<RuleSpec>,
    /// Whether absent rules are deleted.
    pub prune: bool,
}

impl Plan {
    /// The plan that makes `live` what `file` says.
    pub fn new(file: &RulesFile, live: &[RuleResponse], prune: bool) -> Result<Self, CodedError> {
        let mut wanted = BTreeMap::new();
        for spec in &file.rules {
            let spec = spec.normalised()?;
            if wanted.insert(spec.pattern.clone(), spec).is_some() {
                return Err(CodedError::uncoded(
                    "the rules file names a pattern twice; each pattern once".to_owned(),
                ));
            }
        }
        let mut plan = Plan {
            prune,
            ..Plan::default()
        };
        for rule in live {
            let current = RuleSpec::of(rule);
            match wanted.remove(&rule.pattern) {
                None => plan.absent.push((rule.version, current)),
                Some(want) if want == current => plan.unchanged.push(want),
                Some(want) => plan.update.push((rule.version, current, want)),
            }
        }
        plan.create = wanted.into_values().collect();
        Ok(plan)
    }

    /// Whether applying it changes anything.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && (!self.prune || self.absent.is_empty())
    }

    /// The one request that applies it, with version preconditions: it fails as a whole if
    /// the live book changed since the plan was made.
    pub fn request(&self) -> ApplyRulesRequest {
        let mut upserts: Vec<UpsertRuleRequest> = self
            .create
            .iter()
            .map(|s| s.request(PreconditionRequest::DoesNotExist))
            .collect();
        upserts.extend(self.update.iter().map(|(version, _, want)| {
            want.request(PreconditionRequest::Matches { version: *version })
        }));
        let deletes = if self.prune {
            self.absent
                .iter()
                .map(|(version, spec)| DeleteRuleRequest {
                    pattern: spec.pattern.clone(),
                    expected_version: Some(*version),
                })
                .collect()
        } else {
            Vec::new()
        };
        ApplyRulesRequest { upserts, deletes }
    }

    /// The plan as a person reads it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for spec in &self.create {
            let _ = writeln!(out, "+ create     {}  {}", spec.pattern, spec.summary());
        }
        for (_, from, to) in &self.update {
            let _ = writeln!(
                out,
                "~ update     {}  {}  ->  {}",
                to.pattern,
                from.summary(),
                to.summary()
            );
        }
        for (_, spec) in &self.absent {
            if self.prune {
                let _ = writeln!(out, "- delete     {}  {}", spec.pattern, spec.summary());
            } else {
                let _ = writeln!(
                    out,
                    "! not in file {}  (kept; --prune deletes it)",
                    spec.pattern
                );
            }
        }
        for spec in &self.unchanged {
            let _ = writeln!(out, "= unchanged  {}", spec.pattern);
        }
        let deleted = if self.prune { self.absent.len() } else { 0 };
        let _ = writeln!(
            out,
            "{} to create, {} to update, {} to delete, {} unchanged",
            self.create.len(),
            self.update.len(),
            deleted,
            self.unchanged.len()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_api::limits::BurstableBounds;

    /// A rules file's rule is the API's `Limits` spelled flat beside the rule's own pattern,
    /// mode, description and switch: every field of `Limits` (built whole, so a new field
    /// stops this from compiling until it is set here) reads back from the file, and a key
    /// neither has is refused, naming it.
    #[test]
    fn a_rules_file_takes_every_field_of_the_apis_limits_and_no_other() {
        let spec = RuleSpec {
            pattern: "*".into(),
            limits: Limits {
                concurrency: Some(Concurrency::Fixed(2)),
                rate: Some("10/s".into()),
                burst: Some(2),
                on_exceed: Some("reject".into()),
                max_queued: Some(10),
                weight: Some(2),
                max_wait: Some("30s".into()),
                adaptive: Some(sluice_api::limits::AdaptiveBounds { min: 1, max: 8 }),
                quota: Some("100/day".into()),
                budget: Some("1000/day".into()),
                reserve: Some(10),
                budget_unit: Some("tokens".into()),
                burst_budget: Some("2x 10m/day".into()),
                on_full: Some("keep_newest".into()),
                debounce: Some("2s first max 30s".into()),
            },
            mode: Some("shadow".into()),
            description: Some("d".into()),
            disabled: true,
        };
        let file = RulesFile {
            rules: vec![spec.clone()],
        };
        let toml_text = toml::to_string(&file).unwrap();
        assert!(toml_text.contains("concurrency = 2"), "flat: {toml_text}");
        let read: RulesFile = toml::from_str(&toml_text).unwrap();
        assert_eq!(read.rules, std::slice::from_ref(&spec), "{toml_text}");
        let json_text = serde_json::to_string(&file).unwrap();
        let read: RulesFile = serde_json::from_str(&json_text).unwrap();
        assert_eq!(read.rules, [spec], "{json_text}");

        let unknown: Result<RulesFile, _> =
            toml::from_str("[[rules]]\npattern = \"a\"\nconcurrency = 1\nspeed = 3\n");
        let err = unknown.unwrap_err().to_string();
        assert!(err.contains("rule 'a'") && err.contains("speed"), "{err}");
        let nameless: Result<RulesFile, _> = toml::from_str("[[rules]]\nconcurrency = 1\n");
        assert!(nameless.unwrap_err().to_string().contains("pattern"));
    }

    fn live(pattern: &str, version: u32, limits: Limits) -> RuleResponse {
        RuleResponse {
            pattern: pattern.into(),
            limits,
            description: None,
            disabled: false,
            mode: "enforce".into(),
            version,
            last_modified_millis_since_epoch: 0,
        }
    }

    const FILE: &str = r#"
[[rules]]
pattern = "*"
concurrency = 2

[[rules]]
pattern = "openai"
rate = "100/minute"
concurrency = 5

[[rules]]
pattern = "acme"
rate = "10/s"
burst = 3
"#;

    #[test]
    fn a_plan_creates_updates_keeps_and_prunes() {
        let file: RulesFile = toml::from_str(FILE).unwrap();
        let book = [
            live(
                "*",
                4,
                Limits {
                    concurrency: Some(Concurrency::Fixed(2)),
                    ..Limits::default()
                },
            ),
            live(
                "acme",
                7,
                Limits {
                    rate: Some("10/s".into()),
                    burst: Some(1),
                    ..Limits::default()
                },
            ),
            live("old", 2, Limits::default()),
        ];
        let plan = Plan::new(&file, &book, false).unwrap();
        assert_eq!(plan.unchanged.len(), 1, "{}", plan.render());
        assert_eq!(
            plan.create[0].limits.rate.as_deref(),
            Some("100/min"),
            "normalised"
        );
        assert_eq!(plan.update[0].2.limits.burst, Some(3));
        assert!(
            plan.render().contains("! not in file old"),
            "{}",
            plan.render()
        );
        assert!(
            plan.request().deletes.is_empty(),
            "nothing deleted without --prune"
        );
        let pruning = Plan::new(&file, &book, true).unwrap();
        let request = pruning.request();
        assert_eq!(request.deletes[0].expected_version, Some(2));
        assert!(matches!(
            request.upserts[1].precondition,
            Some(PreconditionRequest::Matches { version: 7 })
        ));
        assert!(
            pruning
                .render()
                .contains("1 to create, 1 to update, 1 to delete, 1 unchanged")
        );
        // The live book exported and planned against itself changes nothing.
        let exported: RulesFile = toml::from_str(&export(&book, false)).unwrap();
        assert!(Plan::new(&exported, &book, true).unwrap().is_empty());
    }

    proptest::proptest! {
        /// Any stored book, defaults spelled out or not, exports to a file that plans nothing:
        /// export then apply is a no-op (before, a rule stored with `weight: 1` planned an
        /// update).
        #[test]
        fn export_then_apply_plans_nothing(
            rules in proptest::collection::vec(
                (
                    // A bound, burstable with a guarantee now and then.
                    proptest::option::of((1u32..50, proptest::option::of(1u32..50))),
                    proptest::option::of(proptest::sample::select(vec!["10/s", "100/min", "5/10s"])),
                    proptest::option::of(1u32..5),
                    proptest::option::of(proptest::sample::select(vec!["throttle", "reject"])),
                    proptest::option::of(1u32..100),
                    proptest::option::of(1u32..4),
                    proptest::sample::select(vec!["enforce", "shadow"]),
                    proptest::bool::ANY,
                    (
                        proptest::option::of(proptest::sample::select(vec!["500ms", "30s", "5m"])),
                        proptest::option::of(proptest::sample::select(vec!["10/h", "500/day", "7/month"])),
                    ),
                ),
                0..6,
            ),
            json in proptest::bool::ANY,
        ) {
            let book: Vec<RuleResponse> = rules
                .into_iter()
                .enumerate()
                .map(|(i, (concurrency, rate, burst, on_exceed, max_queued, weight, mode, disabled, (max_wait, quota)))| {
                    let rated = rate.is_some();
                    let exceeds = rated || quota.is_some();
                    RuleResponse {
                        mode: mode.into(),
                        disabled,
                        ..live(
                            &format!("s{i}"),
                            1,
                            Limits {
                                concurrency: concurrency.map(|(max, min)| match min {
                                    Some(min) => Concurrency::Burstable(BurstableBounds {
                                        min: min.min(max),
                                        max,
                                    }),
                                    None => Concurrency::Fixed(max),
                                }),
                                rate: rate.map(str::to_owned),
                                burst: burst.filter(|_| rated),
                                on_exceed: on_exceed.filter(|_| exceeds).map(str::to_owned),
                                max_queued,
                                weight,
                                max_wait: max_wait.map(str::to_owned),
                                adaptive: None,
                                quota: quota.map(str::to_owned),
                                budget: None,
                                reserve: None,
                                budget_unit: None,
                                burst_budget: None,
                                on_full: None,
                                debounce: None,
                            },
                        )
                    }
                })
                .collect();
            let text = export(&book, json);
            let file: RulesFile = if json {
                serde_json::from_str(&text).unwrap()
            } else {
                toml::from_str(&text).unwrap()
            };
            let plan = Plan::new(&file, &book, true).unwrap();
            proptest::prop_assert!(plan.is_empty(), "{}\n{}", text, plan.render());
        }
    }

    #[test]
    fn a_bad_file_says_what_is_wrong() {
        let typo: Result<RulesFile, _> =
            toml::from_str("[[rules]]\npattern = \"*\"\nconcurency = 2\n");
        assert!(typo.unwrap_err().to_string().contains("concurency"));
        for (text, want) in [
            (
                "[[rules]]\npattern = \"*\"\nburst = 2\n",
                "burst needs a rate",
            ),
            (
                "[[rules]]\npattern = \"*\"\nrate = \"1/week\"\n",
                "<count>/<unit>",
            ),
            (
                "[[rules]]\npattern = \"a\"\n[[rules]]\npattern = \"a\"\n",
                "twice",
            ),
        ] {
            let file: RulesFile = toml::from_str(text).unwrap();
            let err = Plan::new(&file, &[], false).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
