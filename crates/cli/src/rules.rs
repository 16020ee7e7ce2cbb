//! `sluice rules …`: the flow-control rule book through the admin API.

use clap::Subcommand;
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::AdminClient;
use crate::clock::rfc3339;
use crate::errors::CodedError;
use crate::registry::AdminArgs;
use crate::table;
use sluice_api::limits::{ListRulesResponse, RuleResponse};

/// How often `rules set` re-reads and retries when another writer got in between.
const SET_ATTEMPTS: usize = 5;

/// `sluice rules …`
#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Create a rule, or change the given fields of an existing one (the rest is kept).
    Set {
        /// `*`, `scope`, `scope/l1`, `*/l1/l2`, …
        pattern: String,
        /// Invocations running at once.
        #[arg(long, conflicts_with = "unlimited")]
        concurrency: Option<u32>,
        /// No bound (the rule still shadows broader ones).
        #[arg(long)]
        unlimited: bool,
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
    match rule.limits.concurrency {
        Some(n) => json!({"concurrency": n}),
        None => json!({}),
    }
}

/// Runs a rules command.
pub async fn run(cmd: &RulesCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    let (done, json) = match cmd {
        RulesCommand::Set {
            pattern,
            concurrency,
            unlimited,
            description,
        } => {
            let answer = update(&admin, pattern, |existing| {
                let limits = match (concurrency, unlimited, existing) {
                    (Some(n), _, _) => json!({"concurrency": n}),
                    (None, true, _) => json!({}),
                    (None, false, Some(rule)) => limits_of(rule),
                    (None, false, None) => {
                        return Err(CodedError::uncoded(format!(
                            "rule '{pattern}' does not exist yet: give --concurrency N or --unlimited"
                        )));
                    }
                };
                Ok(json!({
                    "pattern": pattern,
                    "limits": limits,
                    "description": description.clone().or_else(|| existing.and_then(|r| r.description.clone())),
                    "disabled": existing.is_some_and(|r| r.disabled),
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
                }))
            })
            .await?;
            let what = if disable { "disabled" } else { "enabled" };
            (format!("rule '{pattern}' {what}"), answer)
        }
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
        RulesCommand::List { extra } => {
            let list = rules(&admin).await?;
            if args.json {
                table::print_json(&json!({"rules": list}));
                return Ok(());
            }
            let mut header = vec!["PATTERN", "CONCURRENCY", "DISABLED"];
            if *extra {
                header.extend(["DESCRIPTION", "VERSION", "LAST MODIFIED"]);
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|r| {
                    let mut row = vec![
                        r.pattern.clone(),
                        r.limits
                            .concurrency
                            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                        r.disabled.to_string(),
                    ];
                    if *extra {
                        row.extend([
                            r.description.clone().unwrap_or_default(),
                            r.version.to_string(),
                            rfc3339(r.last_modified_millis_since_epoch).unwrap_or_default(),
                        ]);
                    }
                    row
                })
                .collect();
            print!("{}", table::render(&header, &rows));
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
