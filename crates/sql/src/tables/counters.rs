//! The live counters' table (`sys_user_limits`): one row per counter, with its limit, what it
//! holds and what its rules spend.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, RecordBatch, StringBuilder, TimestampMillisecondBuilder,
    UInt32Builder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, Scan, batch, counted, internal, scanned, schema, timestamp};
use sluice_flow::limiter::CounterSnapshot;

pub(super) fn user_limits_schema() -> SchemaRef {
    schema(vec![
        ("partition_key", DataType::UInt64, false),
        ("scope", DataType::Utf8, false),
        ("l1", DataType::Utf8, true),
        ("l2", DataType::Utf8, true),
        ("level", DataType::Utf8, false),
        ("usage", DataType::UInt32, false),
        ("concurrency_limit", DataType::UInt32, true),
        ("rule_pattern", DataType::Utf8, true),
        ("available", DataType::UInt32, true),
        ("num_waiters", DataType::UInt64, false),
        ("rate", DataType::Utf8, true),
        ("burst", DataType::UInt32, true),
        ("tokens", DataType::UInt32, true),
        ("next_token_at", timestamp(), true),
        ("num_queued", DataType::UInt32, false),
        ("max_queued", DataType::UInt32, true),
        ("weight", DataType::UInt32, false),
        ("shadow_rule", DataType::Utf8, true),
        ("shadow_would_wait", DataType::UInt64, true),
        ("shadow_would_reject", DataType::UInt64, true),
        ("shadow_would_wait_ms", DataType::UInt64, true),
        ("adaptive", DataType::Boolean, false),
        ("guaranteed", DataType::UInt32, true),
        ("borrowed", DataType::UInt32, true),
        ("quota", DataType::Utf8, true),
        ("quota_used", DataType::UInt64, true),
        ("quota_resets_at", timestamp(), true),
        ("budget", DataType::Utf8, true),
        ("budget_spent", DataType::UInt64, true),
        ("budget_reserved", DataType::UInt64, true),
        ("budget_resets_at", timestamp(), true),
        ("budget_overrun", DataType::UInt64, true),
        ("burst_budget", DataType::Utf8, true),
        ("burst_spent_ms", DataType::UInt64, true),
        ("burst_left_ms", DataType::UInt64, true),
    ])
}

/// A counter's burst budget columns: the budget, the ms spent above its concurrency in the
/// window, and the ms left.
fn burst_columns(counters: &[CounterSnapshot]) -> [ArrayRef; 3] {
    let mut budget = StringBuilder::new();
    let (mut spent, mut left) = (UInt64Builder::new(), UInt64Builder::new());
    for c in counters {
        let burst = c.burst_budget;
        budget.append_option(burst.map(|(b, _)| b.to_string()));
        spent.append_option(burst.map(|(_, u)| u.used));
        left.append_option(burst.map(|(b, u)| b.budget.amount.get().saturating_sub(u.used)));
    }
    [
        Arc::new(budget.finish()),
        Arc::new(spent.finish()),
        Arc::new(left.finish()),
    ]
}

/// A counter's shadow rule columns: the rule, and what it would have made wait, refuse and
/// how long it would have held them.
fn shadow_columns(counters: &[CounterSnapshot]) -> [ArrayRef; 4] {
    let mut rule = StringBuilder::new();
    let mut would: [UInt64Builder; 3] = std::array::from_fn(|_| UInt64Builder::new());
    for c in counters {
        let shadow = c.shadow.as_ref();
        rule.append_option(shadow.map(|(rule, _)| rule.pattern.to_string()));
        would[0].append_option(shadow.map(|(_, n)| n.would_wait));
        would[1].append_option(shadow.map(|(_, n)| n.would_reject));
        would[2].append_option(shadow.map(|(_, n)| n.would_wait_ms));
    }
    let [wait, reject, wait_ms] = would.map(|mut b| Arc::new(b.finish()) as ArrayRef);
    [Arc::new(rule.finish()), wait, reject, wait_ms]
}

/// A counter's quota and budget columns: each with what it used and when its window ends;
/// the budget also with what is reserved and how far it ran over.
fn spend_columns(counters: &[CounterSnapshot]) -> [ArrayRef; 8] {
    let (mut quota, mut budget) = (StringBuilder::new(), StringBuilder::new());
    let mut used: [UInt64Builder; 4] = std::array::from_fn(|_| UInt64Builder::new());
    let mut resets: [TimestampMillisecondBuilder; 2] =
        std::array::from_fn(|_| TimestampMillisecondBuilder::new().with_timezone("UTC"));
    let end = |at: u64| i64::try_from(at).unwrap_or(i64::MAX);
    for c in counters {
        quota.append_option(c.quota.map(|(q, _)| q.to_string()));
        used[0].append_option(c.quota.map(|(_, u)| u.used));
        resets[0].append_option(c.quota.map(|(_, u)| end(u.window_end)));
        budget.append_option(c.budget.map(|(b, _, _)| b.to_string()));
        used[1].append_option(c.budget.map(|(_, u, _)| u.used));
        used[2].append_option(c.budget.map(|(_, _, r)| r));
        resets[1].append_option(c.budget.map(|(_, u, _)| end(u.window_end)));
        used[3].append_option(c.budget.map(|_| c.budget_overrun));
    }
    let [quota_used, spent, reserved, overrun] = used.map(|mut b| Arc::new(b.finish()) as ArrayRef);
    let [quota_resets, budget_resets] = resets.map(|mut b| Arc::new(b.finish()) as ArrayRef);
    [
        Arc::new(quota.finish()),
        quota_used,
        quota_resets,
        Arc::new(budget.finish()),
        spent,
        reserved,
        budget_resets,
        overrun,
    ]
}

/// The rows of a scan of counters that only counts them: how many, from the walk that picks a
/// page, with no counter's snapshot.
async fn counted_counters(
    sources: &QuerySources,
    scan: &Scan,
) -> datafusion::error::Result<RecordBatch> {
    let view = sluice_flow::ReadView {
        scope: scan.scope.clone(),
        limit: Some(0),
    };
    let page = sources.runtime.counter_page(view).await.map_err(internal)?;
    counted(scan.rows_of(page.total))
}

/// The live counters: of one scope when the query names it, any `limit` of them (the busiest)
/// when it asks for no more, so a million keys live need not all be read.
pub(super) fn user_limits(sources: &Arc<QuerySources>) -> Reader {
    scanned(sources, |sources, scan| async move {
        if scan.counts_only() {
            return counted_counters(&sources, &scan).await;
        }
        let view = sluice_flow::ReadView {
            scope: scan.scope,
            limit: scan.limit,
        };
        let counters = sources
            .runtime
            .counter_page(view)
            .await
            .map_err(internal)?
            .counters;
        let mut partition = UInt64Builder::new();
        let mut adaptive = BooleanBuilder::new();
        let (mut guaranteed, mut borrowed) = (UInt32Builder::new(), UInt32Builder::new());
        let (mut scope, mut l1, mut l2, mut level) = (
            StringBuilder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
        );
        let (mut usage, mut limit, mut available) = (
            UInt32Builder::new(),
            UInt32Builder::new(),
            UInt32Builder::new(),
        );
        let (mut rule, mut waiters) = (StringBuilder::new(), UInt64Builder::new());
        let (mut rate, mut burst, mut tokens) = (
            StringBuilder::new(),
            UInt32Builder::new(),
            UInt32Builder::new(),
        );
        let mut next_token = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let (mut queued, mut max_queued) = (UInt32Builder::new(), UInt32Builder::new());
        let mut weight = UInt32Builder::new();
        for c in &counters {
            weight.append_value(c.weight);
            partition.append_value(sluice_store::invocation::identity::partition_key(&[
                &c.scope
            ]));
            scope.append_value(&c.scope);
            l1.append_option(c.l1.as_deref());
            l2.append_option(c.l2.as_deref());
            level.append_value(c.level.as_str());
            usage.append_value(c.usage);
            limit.append_option(c.limit.concurrency());
            rule.append_option(c.rule.as_ref().map(|p| p.to_string()));
            available.append_option(c.limit.concurrency().map(|_| c.available));
            waiters.append_value(c.waiters as u64);
            rate.append_option(c.rate.map(|r| r.rate.to_string()));
            burst.append_option(c.rate.map(|r| r.burst.get()));
            tokens.append_option(c.tokens);
            queued.append_value(c.queued);
            max_queued.append_option(c.max_queued);
            adaptive.append_value(c.adaptive.is_some());
            guaranteed.append_option(c.guaranteed);
            borrowed.append_option(c.guaranteed.map(|g| c.usage.saturating_sub(g)));
            next_token.append_option(
                c.next_token_ms
                    .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
            );
        }
        batch(
            &user_limits_schema(),
            vec![
                Arc::new(partition.finish()) as ArrayRef,
                Arc::new(scope.finish()),
                Arc::new(l1.finish()),
                Arc::new(l2.finish()),
                Arc::new(level.finish()),
                Arc::new(usage.finish()),
                Arc::new(limit.finish()),
                Arc::new(rule.finish()),
                Arc::new(available.finish()),
                Arc::new(waiters.finish()),
                Arc::new(rate.finish()),
                Arc::new(burst.finish()),
                Arc::new(tokens.finish()),
                Arc::new(next_token.finish()),
                Arc::new(queued.finish()),
                Arc::new(max_queued.finish()),
                Arc::new(weight.finish()),
            ]
            .into_iter()
            .chain(shadow_columns(&counters))
            .chain([
                Arc::new(adaptive.finish()) as ArrayRef,
                Arc::new(guaranteed.finish()),
                Arc::new(borrowed.finish()),
            ])
            .chain(spend_columns(&counters))
            .chain(burst_columns(&counters))
            .collect(),
        )
    })
}
