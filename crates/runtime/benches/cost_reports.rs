//! What summing a handler's cost reports costs at its invocation's completion, against a
//! control journal of the same size whose run steps are not reports (the audit's attack: 400,000
//! reports took 49 s of a shard's loop). `cargo bench -p sluice-runtime --bench cost_reports`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_protocol::proto::{self, notification_template};
use sluice_protocol::{Frame, Message};
use sluice_runtime::partition::model::cost::{COST_RUN, spent};

/// A journal of `steps` completed run steps named `name`, each completed with `1`.
fn journal(steps: u32, name: &str) -> Vec<Frame> {
    let mut out = Vec::with_capacity(2 * steps as usize + 1);
    out.push(Message::Input(proto::InputCommandMessage::default()).to_frame(false));
    for id in 1..=steps {
        out.push(
            Message::Run(proto::RunCommandMessage {
                result_completion_id: id,
                name: name.to_owned(),
            })
            .to_frame(false),
        );
        out.push(
            Message::RunCompletion(proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(id)),
                result: Some(notification_template::Result::Value(proto::Value {
                    content: bytes::Bytes::from_static(b"1"),
                })),
            })
            .to_frame(false),
        );
    }
    out
}

fn summing(c: &mut Criterion) {
    let mut group = c.benchmark_group("cost reports at completion");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for steps in [100_000, 400_000] {
        let reports = journal(steps, COST_RUN);
        let control = journal(steps, "step");
        group.bench_function(format!("{steps} reports"), |b| {
            b.iter(|| black_box(spent(black_box(&reports))))
        });
        group.bench_function(format!("{steps} other run steps (control)"), |b| {
            b.iter(|| black_box(spent(black_box(&control))))
        });
    }
    group.finish();
}

criterion_group!(benches, summing);
criterion_main!(benches);
