//! `sluice sql "<query>"`: runs a query through `POST /query` and prints a table (from the
//! Arrow IPC answer, so columns keep their order) or, with `--json`, the rows.

use clap::Args;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use super::client::AdminClient;
use super::registry::AdminArgs;
use super::table;
use crate::errors::CodedError;

/// `sluice sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The query, e.g. `SELECT * FROM sys_user_limits`.
    pub query: String,
    /// Admin URL and output format.
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Runs `sluice sql`.
pub async fn run(args: &SqlArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin.admin_url);
    let bytes = admin
        .post_raw("/query", &serde_json::json!({ "query": args.query }))
        .await?;
    let bad = |e: datafusion::arrow::error::ArrowError| {
        CodedError::uncoded(format!("the admin API's Arrow answer cannot be read: {e}"))
    };
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(bad)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
    if args.admin.json {
        let rows = crate::sql::rows(&batches);
        table::print_json(&rows);
        return Ok(());
    }
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
