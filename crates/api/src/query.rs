//! SQL over the system tables.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A query.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QueryRequest {
    /// The SQL, e.g. `SELECT * FROM sys_user_limits`.
    pub query: String,
}
