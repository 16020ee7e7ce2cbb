//! `sluice rules …`: the flow-control rule book through the admin API.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::rules_file::{self, Plan};
use crate::table;
use sluice_api::limits::{Limits, ListRulesResponse, RuleResponse};
use sluice_core::clock::rfc3339;
use sluice_core::errors::CodedError;

/// How often `rules set` re-reads and retries when another writer got in between.
const SET_ATTEMPTS: usize = 5;

/// `sluice rules …`
#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Create a rule, or change the given fields of an existing one (the rest is kept).
    Set {
        /// `*`, `scope`, `scope/l1`, `*/l1/l2`, …
        pattern: String,
        /// The limits to set (boxed: the flags dwarf every other command).
        #[command(flatten)]
        limits: Box<LimitArgs>,
        /// Free text.
        #[arg(long)]
        description: Option<String>,
    },
    /// List the rules.
    List {
        /// Also show description, version and last change.
        #[arg(long)]
        extra: bool,
    },
    /// Keep a rule but stop applying it.
    Disable {
        /// The rule's pattern.
        pattern: String,
    },
    /// Apply a disabled rule again.
    Enable {
        /// The rule's pattern.
        pattern: String,
    },
    /// Remove a rule.
    Delete {
        /// The rule's pattern.
        pattern: String,
    },
    /// Make the rule book what a file says: prints the plan (create, update, delete,
    /// unchanged), then applies it as one change that fails whole if the book moved meanwhile.
    Apply {
        /// TOML (`[[rules]]` tables) or, for a `.json` name, JSON (`{"rules": [...]}`).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Print the plan only.
        #[arg(long)]
        dry_run: bool,
        /// Also delete live rules the file does not name.
        #[arg(long)]
        prune: bool,
    },
    /// Start the quota count of every counter the pattern matches again from 0, in the
    /// current window (on every node's partitions).
    ResetQuota {
        /// The pattern (`acme`, `acme/*`, …).
        pattern: String,
    },
    /// Start the budget's spend of every counter the pattern matches again from 0, in the
    /// current window (on every node's partitions).
    ResetBudget {
        /// The pattern (`acme`, `acme/*`, …).
        pattern: String,
    },
    /// Start the time spent above their concurrency of every counter with a burst budget the
    /// pattern matches again from 0, in the current window (on every node's partitions).
    ResetBurst {
        /// The pattern (`acme`, `acme/*`, …).
        pattern: String,
    },
    /// Write the live rule book in the format `rules apply` reads.
    Export {
        /// Write here instead of stdout (a `.json` name writes JSON).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// `toml` (default) or `json`.
        #[arg(long)]
        format: Option<String>,
    },
}

/// The limit flags of `rules set`: what to change of the rule's limits.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Invocations running at once: `N`, or `MIN:MAX` for a burstable limit on a key level
    /// (each key is guaranteed MIN and borrows up to MAX while its parent has idle capacity).
    #[arg(long, value_name = "N|MIN:MAX", value_parser = concurrency, conflicts_with = "unlimited")]
    pub concurrency: Option<sluice_api::limits::Concurrency>,
    /// No bound at all: no concurrency limit and no rate (the rule still shadows broader
    /// ones).
    #[arg(long, conflicts_with_all = ["rate", "burst"])]
    pub unlimited: bool,
    /// Admissions per unit of time, e.g. `100/s`, `6000/min`, `10/h`: new invocations
    /// beyond it wait in their queue for a token.
    #[arg(long, conflicts_with = "no_rate")]
    pub rate: Option<String>,
    /// Tokens the rate's bucket holds when full (default 1).
    #[arg(long, conflicts_with = "no_rate")]
    pub burst: Option<u32>,
    /// Remove the rule's rate (and burst).
    #[arg(long)]
    pub no_rate: bool,
    /// What a new invocation that finds no token gets: `throttle` (wait) or `reject` (429).
    #[arg(long, value_parser = ["throttle", "reject"])]
    pub on_exceed: Option<String>,
    /// Most invocations that may wait at a counter; beyond it new ones get 429.
    #[arg(long, conflicts_with = "no_max_queued")]
    pub max_queued: Option<u32>,
    /// Remove the rule's max-queued.
    #[arg(long)]
    pub no_max_queued: bool,
    /// The share its keys get under contention relative to their siblings (1-1000, default 1).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Longest a new invocation may wait at a counter (`500ms`, `30s`, `5m`); past it, it is
    /// dropped without starting (504 FLO0003).
    #[arg(long, conflicts_with = "no_max_wait")]
    pub max_wait: Option<String>,
    /// Remove the rule's max-wait.
    #[arg(long)]
    pub no_max_wait: bool,
    /// A limit that moves with the deployment's latency between MIN (where it starts) and
    /// MAX, e.g. `1:64`; a static --concurrency on the rule wins.
    #[arg(long, value_name = "MIN:MAX", value_parser = adaptive_bounds, conflicts_with = "no_adaptive")]
    pub adaptive: Option<sluice_api::limits::AdaptiveBounds>,
    /// Remove the rule's adaptive limit.
    #[arg(long)]
    pub no_adaptive: bool,
    /// New admissions per calendar window of UTC at each counter, kept durably:
    /// `10000/day`, `500/h`, `1000000/month` (past it: wait for the next window, or 429 with
    /// `--on-exceed reject`).
    #[arg(long, conflicts_with = "no_quota")]
    pub quota: Option<String>,
    /// Remove the rule's quota.
    #[arg(long)]
    pub no_quota: bool,
    /// What calls may spend per calendar window of UTC at each counter, as their handlers
    /// report it (`sluice:cost` steps): `1000000/day`, `5000/min` (past it: wait for the next
    /// window, or 429 with `--on-exceed reject`).
    #[arg(long, conflicts_with = "no_budget")]
    pub budget: Option<String>,
    /// Reserved of the budget per running call, settled when it ends (only with a budget).
    #[arg(long)]
    pub reserve: Option<u64>,
    /// The budget's unit, for people (`tokens`).
    #[arg(long)]
    pub budget_unit: Option<String>,
    /// Remove the rule's budget (with its reserve and unit).
    #[arg(long)]
    pub no_budget: bool,
    /// Let the (fixed) concurrency rise by a factor for a budget of time above it per
    /// calendar window of UTC: `2x 10m/day`.
    #[arg(long, conflicts_with = "no_burst_budget")]
    pub burst_budget: Option<String>,
    /// Remove the rule's burst budget.
    #[arg(long)]
    pub no_burst_budget: bool,
    /// What a new call meets at a full counter: `queue` (default), `drop_new`, `keep_oldest`,
    /// `keep_newest` or `cancel_running`.
    #[arg(long)]
    pub on_full: Option<String>,
    /// Make calls of one target at the counter within a wait one delayed run:
    /// `<wait>[ first|last][ max <time>]` (`2s`, `500ms first`, `2s max 30s`).
    #[arg(long, conflicts_with = "no_debounce")]
    pub debounce: Option<String>,
    /// Remove the rule's debounce.
    #[arg(long)]
    pub no_debounce: bool,
    /// Count what the rule would do without enforcing it (`mode = "shadow"`).
    #[arg(long, conflicts_with = "enforce")]
    pub shadow: bool,
    /// Enforce a shadow rule.
    #[arg(long)]
    pub enforce: bool,
}

/// `N` or `MIN:MAX` for `--concurrency`.
fn concurrency(text: &str) -> Result<sluice_api::limits::Concurrency, String> {
    use sluice_api::limits::{BurstableBounds, Concurrency};
    if let Ok(n) = text.parse::<u32>() {
        return Ok(Concurrency::Fixed(n));
    }
    let (min, max) = text
        .split_once(':')
        .ok_or_else(|| format!("'{text}' is not N or MIN:MAX"))?;
    let parse = |n: &str| {
        n.trim()
            .parse::<u32>()
            .map_err(|_| format!("'{text}' is not N or MIN:MAX"))
    };
    Ok(Concurrency::Burstable(BurstableBounds {
        min: parse(min)?,
        max: parse(max)?,
    }))
}

/// `MIN:MAX` for `--adaptive`.
fn adaptive_bounds(text: &str) -> Result<sluice_api::limits::AdaptiveBounds, String> {
    let (min, max) = text
        .split_once(':')
        .ok_or_else(|| format!("'{text}' is not MIN:MAX (e.g. 1:64)"))?;
    let number = |n: &str| {
        n.trim()
            .parse::<u32>()
            .map_err(|e| format!("'{n}' in '{text}': {e}"))
    };
    Ok(sluice_api::limits::AdaptiveBounds {
        min: number(min)?,
        max: number(max)?,
    })
}

impl LimitArgs {
    /// The rule's mode after this change.
    fn mode(&self, existing: Option<&RuleResponse>) -> String {
        match (self.shadow, self.enforce) {
            (true, _) => "shadow".to_owned(),
            (_, true) => "enforce".to_owned(),
            _ => existing.map_or_else(|| "enforce".to_owned(), |r| r.mode.clone()),
        }
    }
}

/// A rule's budget as `rules list --extra` shows it: `1000000/day tokens, reserve 4000`.
fn budget_text(limits: &Limits) -> String {
    let Some(budget) = &limits.budget else {
        return "-".to_owned();
    };
    let mut text = budget.clone();
    if let Some(unit) = &limits.budget_unit {
        text.push(' ');
        text.push_str(unit);
    }
    if let Some(reserve) = limits.reserve {
        text.push_str(&format!(", reserve {reserve}"));
    }
    text
}

/// Starts the `what` (`quota` or `budget`) of every counter `pattern` matches again from 0;
/// what to say, and the answer.
async fn reset(
    admin: &AdminClient,
    what: &str,
    pattern: &str,
) -> Result<(String, serde_json::Value), CodedError> {
    let answer = admin
        .call(
            Method::POST,
            &format!("/limits/rules/reset-{what}"),
            Some(&json!({"pattern": pattern})),
        )
        .await?;
    let reset = answer.json["reset"].as_u64().unwrap_or(0);
    Ok((
        format!("{what} of '{pattern}' reset at {reset} counter(s)"),
        answer.json,
    ))
}

async fn rules(admin: &AdminClient) -> Result<Vec<RuleResponse>, CodedError> {
    let list: ListRulesResponse = admin
        .call(Method::GET, "/limits/rules", None::<&()>)
        .await?
        .parse()?;
    Ok(list.rules)
}

fn not_found(pattern: &str) -> CodedError {
    CodedError::uncoded(format!(
        "no rule with pattern '{pattern}' (see `sluice rules list`)"
    ))
}

/// PUTs one rule built from the current one, re-reading and retrying when its version moved.
async fn update(
    admin: &AdminClient,
    pattern: &str,
    change: impl Fn(Option<&RuleResponse>) -> Result<Value, CodedError>,
) -> Result<Value, CodedError> {
    let mut last = None;
    for _ in 0..SET_ATTEMPTS {
        let current = rules(admin).await?;
        let existing = current.iter().find(|r| r.pattern == pattern);
        let mut body = change(existing)?;
        body["precondition"] = match existing {
            Some(rule) => json!({"type": "matches", "version": rule.version}),
            None => json!({"type": "does_not_exist"}),
        };
        match admin
            .call(Method::PUT, "/limits/rules", Some(&json!([body])))
            .await
        {
            Ok(answer) => return Ok(answer.json),
            Err(e) if e.message.contains("precondition") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| not_found(pattern)))
}

fn limits_of(rule: &RuleResponse) -> Value {
    serde_json::to_value(&rule.limits).unwrap_or_else(|_| json!({}))
}

/// The limits `rules set` asks for: the existing rule's, with the flags given applied.
fn limits_set(
    pattern: &str,
    existing: Option<&RuleResponse>,
    flags: &LimitArgs,
) -> Result<Value, CodedError> {
    if existing.is_none()
        && flags.concurrency.is_none()
        && flags.rate.is_none()
        && flags.quota.is_none()
        && flags.budget.is_none()
        && !flags.unlimited
    {
        return Err(CodedError::uncoded(format!(
            "rule '{pattern}' does not exist yet: give --concurrency N, --rate R, --quota Q, --budget B or --unlimited"
        )));
    }
    let mut limits = match existing {
        Some(rule) if !flags.unlimited => rule.limits.clone(),
        _ => Limits::default(),
    };
    if flags.concurrency.is_some() {
        limits.concurrency = flags.concurrency;
    }
    if flags.no_rate {
        limits.rate = None;
        limits.burst = None;
    }
    if flags.on_exceed.is_some() {
        limits.on_exceed.clone_from(&flags.on_exceed);
    }
    if flags.no_max_queued {
        limits.max_queued = None;
    }
    if flags.max_queued.is_some() {
        limits.max_queued = flags.max_queued;
    }
    if flags.rate.is_some() {
        limits.rate.clone_from(&flags.rate);
    }
    if flags.burst.is_some() {
        limits.burst = flags.burst;
    }
    if flags.weight.is_some() {
        limits.weight = flags.weight;
    }
    if flags.no_max_wait {
        limits.max_wait = None;
    }
    if flags.no_quota {
        limits.quota = None;
    }
    if flags.quota.is_some() {
        limits.quota.clone_from(&flags.quota);
    }
    if flags.no_budget {
        limits.budget = None;
        limits.reserve = None;
        limits.budget_unit = None;
    }
    if flags.budget.is_some() {
        limits.budget.clone_from(&flags.budget);
    }
    if flags.reserve.is_some() {
        limits.reserve = flags.reserve;
    }
    if flags.budget_unit.is_some() {
        limits.budget_unit.clone_from(&flags.budget_unit);
    }
    if flags.no_burst_budget {
        limits.burst_budget = None;
    }
    if flags.burst_budget.is_some() {
        limits.burst_budget.clone_from(&flags.burst_budget);
    }
    if flags.no_debounce {
        limits.debounce = None;
    }
    if flags.debounce.is_some() {
        limits.debounce.clone_from(&flags.debounce);
    }
    match flags.on_full.as_deref() {
        Some("queue") => limits.on_full = None,
        Some(_) => limits.on_full.clone_from(&flags.on_full),
        None => {}
    }
    if limits.rate.is_none() && limits.quota.is_none() && limits.budget.is_none() {
        limits.on_exceed = None;
    }
    if flags.no_adaptive {
        limits.adaptive = None;
    }
    if flags.adaptive.is_some() {
        limits.adaptive = flags.adaptive;
    }
    if flags.max_wait.is_some() {
        limits.max_wait.clone_from(&flags.max_wait);
    }
    serde_json::to_value(&limits).map_err(|e| CodedError::uncoded(e.to_string()))
}

/// Runs a rules command.
pub async fn run(cmd: &RulesCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    let (done, json) = match cmd {
        RulesCommand::Set {
            pattern,
            limits: flags,
            description,
        } => {
            let answer = update(&admin, pattern, |existing| {
                let limits = limits_set(pattern, existing, flags)?;
                Ok(json!({
                    "pattern": pattern,
                    "limits": limits,
                    "description": description.clone().or_else(|| existing.and_then(|r| r.description.clone())),
                    "disabled": existing.is_some_and(|r| r.disabled),
                    "mode": flags.mode(existing),
                }))
            })
            .await?;
            (format!("rule '{pattern}' set"), answer)
        }
        RulesCommand::Disable { pattern } | RulesCommand::Enable { pattern } => {
            let disable = matches!(cmd, RulesCommand::Disable { .. });
            let answer = update(&admin, pattern, |existing| {
                let rule = existing.ok_or_else(|| not_found(pattern))?;
                if rule.disabled == disable {
                    return Err(CodedError::uncoded(format!(
                        "rule '{pattern}' is already {}",
                        if disable { "disabled" } else { "enabled" }
                    )));
                }
                Ok(json!({
                    "pattern": pattern,
                    "limits": limits_of(rule),
                    "description": rule.description,
                    "disabled": disable,
                    "mode": rule.mode,
                }))
            })
            .await?;
            let what = if disable { "disabled" } else { "enabled" };
            (format!("rule '{pattern}' {what}"), answer)
        }
        RulesCommand::ResetQuota { pattern } => reset(&admin, "quota", pattern).await?,
        RulesCommand::ResetBudget { pattern } => reset(&admin, "budget", pattern).await?,
        RulesCommand::ResetBurst { pattern } => reset(&admin, "burst", pattern).await?,
        RulesCommand::Delete { pattern } => {
            let answer = admin
                .call(
                    Method::POST,
                    "/limits/rules/bulk-delete",
                    Some(&json!([{"pattern": pattern}])),
                )
                .await?;
            if answer.json.as_array().is_none_or(Vec::is_empty) {
                return Err(not_found(pattern));
            }
            (format!("rule '{pattern}' deleted"), answer.json)
        }
        RulesCommand::Apply {
            file,
            dry_run,
            prune,
        } => match apply(&admin, file, *dry_run, *prune).await? {
            Some(answer) => ("applied".to_owned(), answer),
            None => return Ok(()),
        },
        RulesCommand::Export { output, format } => {
            let json =
                args.json || rules_file::export_as_json(output.as_deref(), format.as_deref());
            let text = rules_file::export(&rules(&admin).await?, json);
            match output {
                None => print!("{text}"),
                Some(path) => std::fs::write(path, text).map_err(|e| {
                    CodedError::uncoded(format!("cannot write {}: {e}", path.display()))
                })?,
            }
            return Ok(());
        }
        RulesCommand::List { extra } => {
            let list = rules(&admin).await?;
            if args.json {
                table::print_json(&json!({"rules": list}));
                return Ok(());
            }
            print!("{}", list_table(&list, *extra));
            return Ok(());
        }
    };
    if args.json {
        table::print_json(&json);
    } else {
        println!("{done}");
    }
    Ok(())
}

/// The rule book as a table; `extra` adds the columns of the rarer limits.
fn list_table(list: &[RuleResponse], extra: bool) -> String {
    let mut header = vec![
        "PATTERN",
        "CONCURRENCY",
        "RATE",
        "WEIGHT",
        "MODE",
        "DISABLED",
    ];
    if extra {
        header.extend([
            "MAX WAIT",
            "ADAPTIVE",
            "QUOTA",
            "BUDGET",
            "ON FULL",
            "DEBOUNCE",
            "DESCRIPTION",
            "VERSION",
            "LAST MODIFIED",
        ]);
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|r| {
            let mut row = vec![
                r.pattern.clone(),
                r.limits
                    .concurrency
                    .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                match (&r.limits.rate, r.limits.burst) {
                    (Some(rate), Some(burst)) if burst > 1 => {
                        format!("{rate} (burst {burst})")
                    }
                    (Some(rate), _) => rate.clone(),
                    (None, _) => "-".to_owned(),
                },
                r.limits.weight.unwrap_or(1).to_string(),
                r.mode.clone(),
                r.disabled.to_string(),
            ];
            if extra {
                row.extend([
                    r.limits.max_wait.clone().unwrap_or_else(|| "-".to_owned()),
                    r.limits
                        .adaptive
                        .map_or_else(|| "-".to_owned(), |a| format!("{}..{}", a.min, a.max)),
                    r.limits.quota.clone().unwrap_or_else(|| "-".to_owned()),
                    budget_text(&r.limits),
                    r.limits
                        .on_full
                        .clone()
                        .unwrap_or_else(|| "queue".to_owned()),
                    r.description.clone().unwrap_or_default(),
                    r.version.to_string(),
                    rfc3339(r.last_modified_millis_since_epoch).unwrap_or_default(),
                ]);
            }
            row
        })
        .collect();
    table::render(&header, &rows)
}

/// Applies the rules file `file` (its plan printed first): the admin API's answer, or `None`
/// for a dry run or a plan with nothing to do.
async fn apply(
    admin: &AdminClient,
    file: &std::path::Path,
    dry_run: bool,
    prune: bool,
) -> Result<Option<Value>, CodedError> {
    let wanted = rules_file::read(file)?;
    let plan = Plan::new(&wanted, &rules(admin).await?, prune)?;
    print!("{}", plan.render());
    if dry_run || plan.is_empty() {
        let what = if dry_run { "dry run" } else { "nothing to do" };
        println!("{what}: the rule book is unchanged");
        return Ok(None);
    }
    let answer = admin
        .call(Method::POST, "/limits/rules/apply", Some(&plan.request()))
        .await
        .map_err(|e| {
            if e.message.contains("precondition") {
                CodedError::uncoded(format!(
                    "the rule book changed since the plan was made, nothing was applied; run `sluice rules apply` again ({})",
                    e.message
                ))
            } else {
                e
            }
        })?;
    Ok(Some(answer.json))
}
