//! `POST /query`: SQL over the system tables. `accept: application/json` answers
//! `{"rows": [...]}`; anything else an Arrow IPC stream.
//!
//! In cluster mode a query reads each partition's rows from the node leading it: this node
//! asks every other leading node for its share of each partitioned table the query scans (the
//! same route, forwarded: `x-sluice-forwarded`), whose answer names the partitions it covers
//! in `x-sluice-led`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use datafusion::arrow::ipc::writer::StreamWriter;
use http::{HeaderMap, header};

use super::json::Json;
use super::{AdminError, AdminState};
pub use sluice_api::query::QueryRequest;
use sluice_core::errors::Code;
use sluice_runtime::partition::placement::Placement;
use sluice_runtime::replication::relay::{from_node, json_as_caller, relay};
use sluice_sql::{Ask, Gather, QueryAnswer, QueryError, Reach, Share, rows_document};

/// The partitions a node's share of a cluster-wide query covers, comma-separated.
const LED: &str = "x-sluice-led";

/// The code of each way a query fails.
fn refused(e: &QueryError) -> Response {
    let code = match e {
        QueryError::Sql(_) => Code::SQL0001,
        QueryError::NotAllowed(_) => Code::SEC0006,
        QueryError::Timeout(_) => Code::SQL0002,
        QueryError::TooManyRows(_) => Code::SQL0003,
        QueryError::TooMuchMemory(_) => Code::SQL0004,
    };
    AdminError::coded(code, e.to_string()).into_response()
}

fn arrow_stream(answer: &QueryAnswer) -> Result<Vec<u8>, String> {
    let mut writer =
        StreamWriter::try_new(Vec::new(), &answer.schema).map_err(|e| e.to_string())?;
    for batch in &answer.batches {
        writer.write(batch).map_err(|e| e.to_string())?;
    }
    writer.into_inner().map_err(|e| e.to_string())
}

/// Runs a query over `sys_rules`, `sys_user_limits`, `sys_scheduler` (flow control only),
/// `sys_invocation`, `sys_deployment` and `sys_service`.
#[utoipa::path(post, path = "/query", tag = "introspection", operation_id = "query",
    request_body = QueryRequest,
    responses((status = 200, description = "`{\"rows\": [...]}` (accept: application/json, null columns left out) or an Arrow IPC stream"),
        (status = 400, description = "`{\"message\": ..., \"restate_code\": ...}`: bad SQL or an unknown table or column (SQL0001), a timeout (SQL0002), too many rows (SQL0003), too much memory (SQL0004), a statement that is not one read-only query (SEC0006)")))]
pub async fn query(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Json(request): Json<QueryRequest>,
) -> Response {
    let placement = state.runtime.placement();
    let reach = if !placement.is_clustered() || request.local {
        Reach::Here
    } else if from_node(placement, &headers) {
        Reach::Led(Arc::new(placement.led()))
    } else {
        Reach::Cluster(gather(
            Arc::clone(placement),
            headers.get(header::AUTHORIZATION),
            &state.config.admin,
        ))
    };
    let answer = match state.query.query(&request.query, reach).await {
        Ok(answer) => answer,
        Err(e) => return refused(&e),
    };
    let led = answer.led.as_ref().map(|led| {
        led.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    });
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if wants_json {
        let memory = state.config.admin.query_memory_limit;
        let Some(text) = rows_document(&answer.batches, memory.as_usize()) else {
            return refused(&QueryError::TooMuchMemory(memory));
        };
        return (
            [(header::CONTENT_TYPE, "application/json")],
            axum::body::Body::from(text),
        )
            .into_response();
    }
    match arrow_stream(&answer) {
        Ok(bytes) => {
            let mut response = (
                [(header::CONTENT_TYPE, "application/vnd.apache.arrow.stream")],
                bytes,
            )
                .into_response();
            if let Some(led) = led.and_then(|led| http::HeaderValue::from_str(&led).ok()) {
                response.headers_mut().insert(LED, led);
            }
            response
        }
        Err(e) => AdminError::coded(
            Code::SQL0005,
            format!("cannot encode the answer as Arrow IPC: {e}"),
        )
        .into_response(),
    }
}

/// Reads a table's share from every other node leading partitions, as the caller (its
/// `authorization`, which every node accepts).
fn gather(
    placement: Arc<Placement>,
    authorization: Option<&http::HeaderValue>,
    admin: &sluice_config::AdminConfig,
) -> Gather {
    let client = sluice_runtime::replication::relay::client(Some(admin.query_timeout.0));
    let memory = admin.query_memory_limit;
    let headers = json_as_caller(authorization);
    Arc::new(move |ask: Ask| {
        let (nodes, nobody) = placement.leaders_elsewhere();
        let (client, headers, placement) =
            (client.clone(), headers.clone(), Arc::clone(&placement));
        Box::pin(async move {
            if nobody > 0 {
                return Err(format!(
                    "{nobody} partition(s) have no leader right now (a takeover); retry"
                ));
            }
            let columns: Vec<String> = ask
                .columns
                .iter()
                .map(|c| format!("\"{}\"", c.replace('"', "\"\"")))
                .collect();
            let mut sql = format!("SELECT {} FROM {}", columns.join(", "), ask.table);
            // What the query here lets the reader leave out, the other nodes may leave out too.
            let equals = [("scope", &ask.scope), ("limit_key", &ask.limit_key)]
                .into_iter()
                .filter_map(|(column, value)| {
                    let value = value.as_ref()?.replace('\'', "''");
                    Some(format!("{column} = '{value}'"))
                })
                .collect::<Vec<_>>();
            if !equals.is_empty() {
                sql.push_str(&format!(" WHERE {}", equals.join(" AND ")));
            }
            if let Some(limit) = ask.limit {
                sql.push_str(&format!(" LIMIT {limit}"));
            }
            let body = serde_json::to_vec(&QueryRequest {
                query: sql,
                local: false,
            })
            .map_err(|e| e.to_string())?;
            let placement = &placement;
            let asks = nodes.iter().map(|node| {
                let (client, headers, body) = (&client, &headers, body.clone());
                async move {
                    let answer = relay(
                        placement,
                        client,
                        node,
                        http::Method::POST,
                        "/query",
                        headers,
                        body.into(),
                    )
                    .await?;
                    share_of(node, ask.table, &answer)
                }
            });
            let shares = futures_util::future::join_all(asks)
                .await
                .into_iter()
                .collect::<Result<Vec<Share>, String>>()?;
            let bytes: usize = shares
                .iter()
                .flat_map(|s| &s.batches)
                .map(datafusion::arrow::array::RecordBatch::get_array_memory_size)
                .sum();
            if bytes > memory.as_usize() {
                return Err(format!(
                    "the other nodes' rows of {} need {bytes} bytes, over admin.query-memory-limit ({memory}): narrow the query to fewer columns",
                    ask.table
                ));
            }
            Ok(shares)
        })
    })
}

/// `node`'s share of `table` from its answer: the partitions it names in `x-sluice-led` and its
/// rows as an Arrow IPC stream, read as hostile input (a bad header or stream fails the query).
fn share_of(
    node: &str,
    table: &str,
    answer: &sluice_runtime::replication::relay::Answer,
) -> Result<Share, String> {
    if !answer.status.is_success() {
        return Err(format!(
            "{node} could not read its rows of {table}: {} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ));
    }
    let led = answer
        .headers
        .get(LED)
        .ok_or_else(|| format!("{node} did not say which partitions it read ({LED})"))?
        .to_str()
        .map_err(|e| format!("{node} sent an unreadable {LED}: {e}"))?;
    let led = led
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{node} sent an unreadable {LED}: {e}"))?;
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(
        std::io::Cursor::new(answer.body.as_ref()),
        None,
    )
    .map_err(|e| format!("{node} answered what is not an Arrow stream: {e}"))?;
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{node} answered a broken Arrow stream: {e}"))?;
    Ok(Share {
        node: node.to_owned(),
        led,
        batches,
    })
}
