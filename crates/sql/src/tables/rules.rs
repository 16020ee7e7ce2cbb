//! The rule book's table: `sys_rules`, one row per rule.

use std::sync::Arc;

use datafusion::arrow::array::{
    BooleanBuilder, StringBuilder, TimestampMillisecondBuilder, UInt32Builder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, batch, reader, schema, timestamp};

pub(super) fn rules_schema() -> SchemaRef {
    schema(vec![
        ("pattern", DataType::Utf8, false),
        ("concurrency", DataType::UInt32, true),
        ("rate", DataType::Utf8, true),
        ("burst", DataType::UInt32, true),
        ("on_exceed", DataType::Utf8, true),
        ("max_queued", DataType::UInt32, true),
        ("weight", DataType::UInt32, false),
        ("mode", DataType::Utf8, false),
        ("max_wait_ms", DataType::UInt64, true),
        ("adaptive_min", DataType::UInt32, true),
        ("adaptive_max", DataType::UInt32, true),
        ("concurrency_min", DataType::UInt32, true),
        ("quota", DataType::Utf8, true),
        ("budget", DataType::Utf8, true),
        ("reserve", DataType::UInt64, true),
        ("budget_unit", DataType::Utf8, true),
        ("description", DataType::Utf8, true),
        ("disabled", DataType::Boolean, false),
        ("version", DataType::UInt32, false),
        ("last_modified", timestamp(), false),
        ("burst_budget", DataType::Utf8, true),
        ("on_full", DataType::Utf8, false),
        ("debounce", DataType::Utf8, true),
    ])
}

pub(super) fn rules(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let book = sources.rules.book();
        let mut rules: Vec<_> = book.rules().collect();
        rules.sort_by_key(|r| r.pattern.to_string());
        let (mut pattern, mut concurrency, mut description) = (
            StringBuilder::new(),
            UInt32Builder::new(),
            StringBuilder::new(),
        );
        let (mut disabled, mut version) = (BooleanBuilder::new(), UInt32Builder::new());
        let (mut rate, mut burst) = (StringBuilder::new(), UInt32Builder::new());
        let (mut on_exceed, mut max_queued) = (StringBuilder::new(), UInt32Builder::new());
        let mut modified = TimestampMillisecondBuilder::new().with_timezone("UTC");
        let (mut weight, mut mode) = (UInt32Builder::new(), StringBuilder::new());
        let mut max_wait = UInt64Builder::new();
        let (mut adaptive_min, mut adaptive_max) = (UInt32Builder::new(), UInt32Builder::new());
        let mut concurrency_min = UInt32Builder::new();
        let mut quota = StringBuilder::new();
        let (mut budget, mut reserve, mut unit) = (
            StringBuilder::new(),
            UInt64Builder::new(),
            StringBuilder::new(),
        );
        let (mut burst_budget, mut on_full) = (StringBuilder::new(), StringBuilder::new());
        let mut debounce = StringBuilder::new();
        for rule in rules {
            debounce.append_option(rule.debounce.map(|d| d.to_string()));
            on_full.append_value(rule.on_full.map_or("queue", sluice_flow::OnFull::as_str));
            burst_budget.append_option(rule.burst_budget.map(|b| b.to_string()));
            quota.append_option(rule.quota.map(|q| q.to_string()));
            budget.append_option(rule.budget.map(|b| b.to_string()));
            reserve.append_option(
                rule.budget
                    .and_then(|b| b.reserve)
                    .map(std::num::NonZeroU64::get),
            );
            unit.append_option(rule.budget_unit.as_deref());
            concurrency_min.append_option(rule.guaranteed.map(std::num::NonZeroU32::get));
            adaptive_min.append_option(rule.adaptive.map(|a| a.min.get()));
            adaptive_max.append_option(rule.adaptive.map(|a| a.max.get()));
            max_wait.append_option(rule.max_wait_ms.map(std::num::NonZeroU64::get));
            weight.append_value(rule.weight.map_or(1, std::num::NonZeroU32::get));
            mode.append_value(if rule.shadow { "shadow" } else { "enforce" });
            pattern.append_value(rule.pattern.to_string());
            concurrency.append_option(rule.limit.concurrency());
            rate.append_option(rule.rate.map(|r| r.rate.to_string()));
            burst.append_option(rule.rate.map(|r| r.burst.get()));
            on_exceed.append_option(
                rule.rejects()
                    .map(|r| if r { "reject" } else { "throttle" }),
            );
            max_queued.append_option(rule.max_queued.map(std::num::NonZeroU32::get));
            description.append_option(rule.description.as_deref());
            disabled.append_value(rule.disabled);
            version.append_value(rule.version);
            modified.append_value(i64::try_from(rule.last_modified_ms).unwrap_or(i64::MAX));
        }
        batch(
            &rules_schema(),
            vec![
                Arc::new(pattern.finish()),
                Arc::new(concurrency.finish()),
                Arc::new(rate.finish()),
                Arc::new(burst.finish()),
                Arc::new(on_exceed.finish()),
                Arc::new(max_queued.finish()),
                Arc::new(weight.finish()),
                Arc::new(mode.finish()),
                Arc::new(max_wait.finish()),
                Arc::new(adaptive_min.finish()),
                Arc::new(adaptive_max.finish()),
                Arc::new(concurrency_min.finish()),
                Arc::new(quota.finish()),
                Arc::new(budget.finish()),
                Arc::new(reserve.finish()),
                Arc::new(unit.finish()),
                Arc::new(description.finish()),
                Arc::new(disabled.finish()),
                Arc::new(version.finish()),
                Arc::new(modified.finish()),
                Arc::new(burst_budget.finish()),
                Arc::new(on_full.finish()),
                Arc::new(debounce.finish()),
            ],
        )
    })
}
