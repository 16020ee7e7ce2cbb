//! `sluice sql "<query>"`: runs a query through `POST /query` and prints a table (from the
//! Arrow IPC answer, so columns keep their order) or, with `--json`, the rows.

use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_ipc::reader::StreamReader;
use clap::Args;

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::table;
use sluice_core::errors::CodedError;

const JSON: &str = "application/json";
const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

fn bad(e: impl std::fmt::Display) -> CodedError {
    CodedError::uncoded(format!(
        "the admin API's answer to a query cannot be read: {e}"
    ))
}

/// `sluice sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The query, e.g. `SELECT * FROM sys_user_limits`.
    pub query: String,
    /// Cluster mode: read only what the asked node holds (its store's partitions and the live
    /// state of those it leads), not every partition from its leader.
    #[arg(long)]
    pub local: bool,
    /// Admin URL and output format.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Runs `sluice sql`.
pub async fn run(args: &SqlArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin.admin_url);
    let body = serde_json::json!({ "query": args.query, "local": args.local });
    if args.admin.json {
        // The server writes the rows the way the reference does (timestamps, durations).
        let bytes = admin.post_raw("/query", &body, JSON).await?;
        let answer: serde_json::Value = serde_json::from_slice(&bytes).map_err(bad)?;
        table::print_json(&answer["rows"]);
        return Ok(());
    }
    let bytes = admin.post_raw("/query", &body, ARROW_STREAM).await?;
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(bad)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
    let options = FormatOptions::default().with_null("");
    let mut rows = Vec::new();
    for batch in &batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        for i in 0..batch.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(i).to_string()).collect());
        }
    }
    let header: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    print!("{}", table::render(&header, &rows));
    println!(
        "{} row{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    Ok(())
}
