//! `sluice weights …`: weight overrides, a counter's share under contention set apart from
//! its rule.

use clap::Subcommand;
use reqwest::Method;

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::table;
use sluice_api::limits::{ListWeightsResponse, SetWeightRequest};
use sluice_core::errors::CodedError;

/// `sluice weights …`
#[derive(Debug, Subcommand)]
pub enum WeightsCommand {
    /// List every weight override.
    List,
    /// Give a counter a weight (1-1000) that beats its rule's.
    Set {
        /// The counter: `scope`, `scope/l1` or `scope/l1/l2` (names only, no `*`).
        counter: String,
        /// Its weight.
        weight: u32,
    },
    /// Remove a counter's override: it takes its rule's weight again.
    Unset {
        /// The counter.
        counter: String,
    },
}

/// Runs a weights command.
pub async fn run(cmd: &WeightsCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    let answer = match cmd {
        WeightsCommand::List => {
            admin
                .call(Method::GET, "/limits/weights", None::<&()>)
                .await?
        }
        WeightsCommand::Set { counter, weight } => {
            let change = [SetWeightRequest {
                counter: counter.clone(),
                weight: Some(*weight),
            }];
            admin
                .call(Method::PUT, "/limits/weights", Some(&change))
                .await?
        }
        WeightsCommand::Unset { counter } => {
            let change = [SetWeightRequest {
                counter: counter.clone(),
                weight: None,
            }];
            admin
                .call(Method::PUT, "/limits/weights", Some(&change))
                .await?
        }
    };
    let list: ListWeightsResponse = answer.parse()?;
    if args.json {
        table::print_json(&serde_json::json!({"overrides": list.overrides}));
    } else {
        let rows: Vec<_> = list
            .overrides
            .iter()
            .map(|o| vec![o.counter.clone(), o.weight.to_string()])
            .collect();
        print!("{}", table::render(&["COUNTER", "WEIGHT"], &rows));
    }
    Ok(())
}
