//! The admin commands of the `sluice` CLI (`deployments`, `services`, `invocations`, `rules`,
//! `plugins`, `queues`, `subscriptions`, `sql`, `explain`): each one or two requests to the admin API
//! through [`client::AdminClient`], read as `sluice_api`'s shapes and printed as a table or JSON.
//! It builds without the server; `sluice serve` and the command line itself live in `sluice`.

pub mod client;
pub mod explain;
pub mod invocations;
pub mod plugins;
pub mod queues;
pub mod registry;
pub mod rules;
pub mod rules_file;
pub mod sql;
pub mod subscriptions;
pub mod table;
pub mod weights;
