//! `?scope=acme&limit=100` on the reads of live flow state (`/limits/counters`, `/vqueues`):
//! a bounded read at each partition, whatever the number of live keys.

use super::error::AdminError;
use sluice_core::errors::Code;
use sluice_flow::ReadView;

/// Rows a read answers when it names no `limit`.
pub const DEFAULT_ROWS: usize = 1_000;

/// Most rows one read may ask for.
pub const MAX_ROWS: usize = 100_000;

/// `?scope=acme&limit=100`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ViewParams {
    /// Only this scope's (for counters: its own and its keys').
    #[serde(default)]
    scope: Option<String>,
    /// At most this many, the busiest by calls waiting, then running or scheduled (1,000 by
    /// default, at most 100,000); `total` says how many matched.
    #[serde(default)]
    limit: Option<usize>,
}

impl ViewParams {
    /// The view asked for, or a 400 saying what to fix.
    pub fn view(&self) -> Result<ReadView, AdminError> {
        let limit = self.limit.unwrap_or(DEFAULT_ROWS);
        if limit == 0 || limit > MAX_ROWS {
            return Err(AdminError::coded(
                Code::ADM0002,
                format!("limit={limit} is out of range: ask for 1 to {MAX_ROWS}"),
            ));
        }
        Ok(ReadView {
            scope: self.scope.clone().filter(|s| !s.is_empty()),
            limit: Some(limit),
        })
    }
}
