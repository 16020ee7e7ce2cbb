//! The live counters' table (`sys_user_limits`): one row per counter, with its limit, what it
//! holds and what its rules spend. Each column is built on its own, so a query that reads two
//! of them over a million counters builds two, not all of them.

use std::fmt::{Display, Write as _};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, RecordBatch, StringBuilder, TimestampMillisecondBuilder,
    UInt32Builder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{QuerySources, Reader, Scan, batch, counted, internal, scanned, schema, timestamp};
use sluice_flow::limiter::CounterSnapshot;

/// How one column is built from the counters read.
type Build = fn(&[CounterSnapshot]) -> ArrayRef;

/// The table's columns, in order: name, type, whether it may be null, how it is built.
const COLUMNS: [(&str, Kind, bool, Build); 35] = [
    ("partition_key", Kind::U64, false, |c| {
        u64s(c, |c| {
            Some(sluice_store::invocation::identity::partition_key(&[
                &c.scope
            ]))
        })
    }),
    ("scope", Kind::Text, false, |c| texts(c, |c| Some(&c.scope))),
    ("l1", Kind::Text, true, |c| texts(c, |c| c.l1.as_ref())),
    ("l2", Kind::Text, true, |c| texts(c, |c| c.l2.as_ref())),
    ("level", Kind::Text, false, |c| {
        texts(c, |c| Some(c.level.as_str()))
    }),
    ("usage", Kind::U32, false, |c| u32s(c, |c| Some(c.usage))),
    ("concurrency_limit", Kind::U32, true, |c| {
        u32s(c, |c| c.limit.concurrency())
    }),
    ("rule_pattern", Kind::Text, true, |c| {
        texts(c, |c| c.rule.as_deref())
    }),
    ("available", Kind::U32, true, |c| {
        u32s(c, |c| c.limit.concurrency().map(|_| c.available))
    }),
    ("num_waiters", Kind::U64, false, |c| {
        u64s(c, |c| Some(c.waiters as u64))
    }),
    ("rate", Kind::Text, true, |c| {
        texts(c, |c| c.controls().rate.map(|r| r.rate))
    }),
    ("burst", Kind::U32, true, |c| {
        u32s(c, |c| c.controls().rate.map(|r| r.burst.get()))
    }),
    ("tokens", Kind::U32, true, |c| {
        u32s(c, |c| c.controls().tokens)
    }),
    ("next_token_at", Kind::Time, true, |c| {
        times(c, |c| c.controls().next_token_ms)
    }),
    ("num_queued", Kind::U32, false, |c| {
        u32s(c, |c| Some(c.queued))
    }),
    ("max_queued", Kind::U32, true, |c| {
        u32s(c, |c| c.controls().max_queued)
    }),
    ("weight", Kind::U32, false, |c| u32s(c, |c| Some(c.weight))),
    ("shadow_rule", Kind::Text, true, |c| {
        texts(c, |c| {
            c.controls().shadow.as_ref().map(|(rule, _)| &rule.pattern)
        })
    }),
    ("shadow_would_wait", Kind::U64, true, |c| {
        u64s(c, |c| {
            c.controls().shadow.as_ref().map(|(_, n)| n.would_wait)
        })
    }),
    ("shadow_would_reject", Kind::U64, true, |c| {
        u64s(c, |c| {
            c.controls().shadow.as_ref().map(|(_, n)| n.would_reject)
        })
    }),
    ("shadow_would_wait_ms", Kind::U64, true, |c| {
        u64s(c, |c| {
            c.controls().shadow.as_ref().map(|(_, n)| n.would_wait_ms)
        })
    }),
    ("adaptive", Kind::Bool, false, |c| {
        bools(c, |c| c.controls().adaptive.is_some())
    }),
    ("guaranteed", Kind::U32, true, |c| {
        u32s(c, |c| c.controls().guaranteed)
    }),
    ("borrowed", Kind::U32, true, |c| {
        u32s(c, |c| {
            c.controls().guaranteed.map(|g| c.usage.saturating_sub(g))
        })
    }),
    ("quota", Kind::Text, true, |c| {
        texts(c, |c| c.controls().quota.map(|(q, _)| q))
    }),
    ("quota_used", Kind::U64, true, |c| {
        u64s(c, |c| c.controls().quota.map(|(_, u)| u.used))
    }),
    ("quota_resets_at", Kind::Time, true, |c| {
        times(c, |c| c.controls().quota.map(|(_, u)| u.window_end))
    }),
    ("budget", Kind::Text, true, |c| {
        texts(c, |c| c.controls().budget.map(|(b, _, _)| b))
    }),
    ("budget_spent", Kind::U64, true, |c| {
        u64s(c, |c| c.controls().budget.map(|(_, u, _)| u.used))
    }),
    ("budget_reserved", Kind::U64, true, |c| {
        u64s(c, |c| c.controls().budget.map(|(_, _, r)| r))
    }),
    ("budget_resets_at", Kind::Time, true, |c| {
        times(c, |c| c.controls().budget.map(|(_, u, _)| u.window_end))
    }),
    ("budget_overrun", Kind::U64, true, |c| {
        u64s(c, |c| {
            c.controls().budget.map(|_| c.controls().budget_overrun)
        })
    }),
    ("burst_budget", Kind::Text, true, |c| {
        texts(c, |c| c.controls().burst_budget.map(|(b, _)| b))
    }),
    ("burst_spent_ms", Kind::U64, true, |c| {
        u64s(c, |c| c.controls().burst_budget.map(|(_, u)| u.used))
    }),
    ("burst_left_ms", Kind::U64, true, |c| {
        u64s(c, |c| {
            c.controls()
                .burst_budget
                .map(|(b, u)| b.budget.amount.get().saturating_sub(u.used))
        })
    }),
];

/// A column's arrow type.
#[derive(Clone, Copy)]
enum Kind {
    U32,
    U64,
    Text,
    Bool,
    Time,
}

impl Kind {
    fn data_type(self) -> DataType {
        match self {
            Kind::U32 => DataType::UInt32,
            Kind::U64 => DataType::UInt64,
            Kind::Text => DataType::Utf8,
            Kind::Bool => DataType::Boolean,
            Kind::Time => timestamp(),
        }
    }
}

pub(super) fn user_limits_schema() -> SchemaRef {
    schema(
        COLUMNS
            .iter()
            .map(|(name, kind, nullable, _)| (*name, kind.data_type(), *nullable))
            .collect(),
    )
}

fn u32s(counters: &[CounterSnapshot], value: impl Fn(&CounterSnapshot) -> Option<u32>) -> ArrayRef {
    let mut column = UInt32Builder::with_capacity(counters.len());
    counters.iter().for_each(|c| column.append_option(value(c)));
    Arc::new(column.finish())
}

fn u64s(counters: &[CounterSnapshot], value: impl Fn(&CounterSnapshot) -> Option<u64>) -> ArrayRef {
    let mut column = UInt64Builder::with_capacity(counters.len());
    counters.iter().for_each(|c| column.append_option(value(c)));
    Arc::new(column.finish())
}

fn bools(counters: &[CounterSnapshot], value: impl Fn(&CounterSnapshot) -> bool) -> ArrayRef {
    let mut column = BooleanBuilder::with_capacity(counters.len());
    counters.iter().for_each(|c| column.append_value(value(c)));
    Arc::new(column.finish())
}

/// A time column from ms since the epoch (past `i64::MAX`: the end of time).
fn times(counters: &[CounterSnapshot], ms: impl Fn(&CounterSnapshot) -> Option<u64>) -> ArrayRef {
    let mut column =
        TimestampMillisecondBuilder::with_capacity(counters.len()).with_timezone("UTC");
    for c in counters {
        column.append_option(ms(c).map(|at| i64::try_from(at).unwrap_or(i64::MAX)));
    }
    Arc::new(column.finish())
}

/// A text column, each value written straight into the column (no string of its own per row).
fn texts<'a, D: Display + 'a>(
    counters: &'a [CounterSnapshot],
    value: impl Fn(&'a CounterSnapshot) -> Option<D>,
) -> ArrayRef {
    let mut column = StringBuilder::with_capacity(counters.len(), counters.len() * 8);
    for c in counters {
        match value(c) {
            Some(text) => {
                // Writing into the builder cannot fail; the row ends with an empty append.
                let _ = write!(column, "{text}");
                column.append_value("");
            }
            None => column.append_null(),
        }
    }
    Arc::new(column.finish())
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
/// when it asks for no more, so a million keys live need not all be read; of those, only the
/// columns the query reads.
pub(super) fn user_limits(sources: &Arc<QuerySources>) -> Reader {
    scanned(sources, |sources, scan| async move {
        if scan.counts_only() {
            return counted_counters(&sources, &scan).await;
        }
        let view = sluice_flow::ReadView {
            scope: scan.scope.clone(),
            limit: scan.limit,
        };
        let counters = sources
            .runtime
            .counter_page(view)
            .await
            .map_err(internal)?
            .counters;
        let all = user_limits_schema();
        let wanted = scan.wanted(&all);
        let columns = wanted
            .iter()
            .map(|&i| match COLUMNS.get(i) {
                Some((_, _, _, build)) => Ok(build(&counters)),
                None => Err(internal(format!("sys_user_limits has no column {i}"))),
            })
            .collect::<datafusion::error::Result<_>>()?;
        batch(&Arc::new(all.project(&wanted)?), columns)
    })
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use sluice_flow::limiter::Limiter;
    use sluice_flow::{Limit, LimitKey, RateLimit, RuleBook, RulePattern, Scope, Upsert};

    use super::*;

    /// Counters of a scope and two of its keys under a rule with a rate, a queue bound, a
    /// quota, a budget and a burst budget, so most columns hold values, some nulls.
    fn counters() -> Vec<CounterSnapshot> {
        let mut book = RuleBook::new();
        let ten = NonZeroU32::new(10).unwrap();
        let rule = Upsert {
            rate: Some(RateLimit {
                rate: "100/s".parse().unwrap(),
                burst: ten,
                reject: false,
            }),
            max_queued: Some(ten),
            quota: Some("10000/day".parse().unwrap()),
            budget: Some("600000/day".parse().unwrap()),
            burst_budget: Some("2x 1h/day".parse().unwrap()),
            ..Upsert::new(
                RulePattern::parse("held/*").unwrap(),
                Limit::Concurrency(ten),
            )
        };
        book.apply_batch(&[rule], 0).unwrap();
        let mut limiter = Limiter::new();
        let scope = Scope::parse("held").unwrap();
        for key in ["k1", "k2"] {
            let path = limiter.path(&scope, Some(&LimitKey::parse(key).unwrap()));
            limiter.count_queued(&path, true);
        }
        limiter.snapshot(&book, 0)
    }

    #[test]
    fn every_column_builds_to_its_type_and_a_projection_builds_only_the_columns_it_names() {
        let counters = counters();
        assert_eq!(counters.len(), 3, "the scope and its two keys");
        let all = user_limits_schema();
        let full = batch(
            &all,
            COLUMNS
                .iter()
                .map(|(_, _, _, build)| build(&counters))
                .collect(),
        )
        .expect("every column of its schema's type and nullability");
        let index = |name: &str| all.index_of(name).unwrap();
        assert!(
            full.column(index("rate")).null_count() < 3,
            "the keys' rate"
        );
        assert_eq!(
            full.column(index("burst_budget")).null_count(),
            1,
            "not the scope's"
        );
        for wanted in [
            vec![index("l1"), index("num_waiters")],
            vec![index("burst_left_ms"), index("scope"), index("quota")],
            vec![index("partition_key")],
        ] {
            let built: Vec<ArrayRef> = wanted.iter().map(|&i| (COLUMNS[i].3)(&counters)).collect();
            let projected = batch(&Arc::new(all.project(&wanted).unwrap()), built).unwrap();
            assert_eq!(projected, full.project(&wanted).unwrap(), "{wanted:?}");
        }
    }
}
