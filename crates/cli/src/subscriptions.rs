//! `sluice subscriptions …`

use std::collections::BTreeMap;

use clap::Subcommand;
use reqwest::Method;

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::table;
use sluice_api::kafka::{ListSubscriptionsResponse, SubscriptionResponse};
use sluice_core::errors::CodedError;

/// `sluice subscriptions …`
#[derive(Debug, Subcommand)]
pub enum SubscriptionsCommand {
    /// Subscribe a handler to a topic: `create kafka://<cluster>/<topic> service://<service>/<handler>`.
    Create {
        /// `kafka://<cluster>/<topic>`.
        source: String,
        /// `service://<service>/<handler>`.
        sink: String,
        /// An option, `key=value` (`scope`, `limit-key`, `auto.offset.reset`); repeat for more.
        #[arg(long = "option", value_name = "KEY=VALUE")]
        options: Vec<String>,
    },
    /// List subscriptions.
    List,
    /// Show one subscription.
    Describe {
        /// `sub_…`
        id: String,
    },
    /// Stop and delete a subscription.
    Delete {
        /// `sub_…`
        id: String,
    },
}

fn row(s: &SubscriptionResponse) -> Vec<String> {
    let options: Vec<String> = s.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
    vec![
        s.id.clone(),
        s.source.clone(),
        s.sink.clone(),
        options.join(","),
    ]
}

const HEADER: [&str; 4] = ["ID", "SOURCE", "SINK", "OPTIONS"];

/// Runs a subscriptions command.
pub async fn run(cmd: &SubscriptionsCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    let answer = match cmd {
        SubscriptionsCommand::Create {
            source,
            sink,
            options,
        } => {
            let options = options
                .iter()
                .map(|o| {
                    o.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .ok_or_else(|| {
                            CodedError::uncoded(format!("--option '{o}': write it as key=value"))
                        })
                })
                .collect::<Result<BTreeMap<_, _>, _>>()?;
            let body = serde_json::json!({"source": source, "sink": sink, "options": options});
            admin
                .call(Method::POST, "/subscriptions", Some(&body))
                .await?
        }
        SubscriptionsCommand::List => {
            admin
                .call(Method::GET, "/subscriptions", None::<&()>)
                .await?
        }
        SubscriptionsCommand::Describe { id } => {
            admin
                .call(Method::GET, &format!("/subscriptions/{id}"), None::<&()>)
                .await?
        }
        SubscriptionsCommand::Delete { id } => {
            admin
                .call(Method::DELETE, &format!("/subscriptions/{id}"), None::<&()>)
                .await?
        }
    };
    if args.json {
        let json = match cmd {
            SubscriptionsCommand::Delete { id } => serde_json::json!({"deleted": id}),
            _ => answer.json,
        };
        table::print_json(&json);
        return Ok(());
    }
    match cmd {
        SubscriptionsCommand::List => {
            let list: ListSubscriptionsResponse = answer.parse()?;
            let rows: Vec<_> = list.subscriptions.iter().map(row).collect();
            print!("{}", table::render(&HEADER, &rows));
        }
        SubscriptionsCommand::Create { .. } | SubscriptionsCommand::Describe { .. } => {
            let sub: SubscriptionResponse = answer.parse()?;
            print!("{}", table::render(&HEADER, &[row(&sub)]));
        }
        SubscriptionsCommand::Delete { id } => println!("deleted {id}"),
    }
    Ok(())
}
