//! A handler as an SDK runs it, reduced to what durability depends on. Its program is its input:
//! one byte per step — `r` a `ctx.run` (a side effect the simulator counts), `s` a sleep, `c` a
//! call to `Leaf/run`, `w` a state write. An attempt replays the journal it was given; at the
//! first step without a result it sends what the step needs and suspends on it, as a
//! request/response SDK does. Its output joins every result it saw.

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message as _;

use crate::invoker::{AttemptRequest, Ending};
use sluice_core::ids::InvocationId;
use sluice_protocol::message::Kind;
use sluice_protocol::proto::{self, notification_template, output_command_message};
use sluice_protocol::{Message, MessageType};

/// Called services: one `ctx.run` each.
pub const LEAF: &str = "Leaf";

/// What one attempt sends.
#[derive(Debug)]
pub struct Turn {
    /// New messages after the replayed journal, in order.
    pub messages: Vec<Message>,
    /// How it ends when nothing fails first.
    pub ending: Ending,
}

/// The step of a program a journal command stands for, to check replays line up.
fn matches(step: u8, command: &Message, completion: u32) -> bool {
    match (step, command) {
        (b'r', Message::Run(run)) => run.result_completion_id == completion && run.name.is_empty(),
        (b'k', Message::Run(run)) => {
            run.result_completion_id == completion
                && run.name == super::super::model::cost::COST_RUN
        }
        (b's', Message::Sleep(sleep)) => sleep.result_completion_id == completion,
        (b'c', Message::Call(call)) => call.result_completion_id == completion + 1,
        (b'w', Message::SetState(_)) => true,
        _ => false,
    }
}

fn suspend(completion: u32) -> Ending {
    Ending::Suspended(Message::Suspension(proto::SuspensionMessage {
        awaiting_on: Some(proto::Future {
            waiting_completions: vec![completion],
            ..proto::Future::default()
        }),
    }))
}

/// The text a notification's result stands for in the output.
fn result_text(result: Option<&notification_template::Result>) -> String {
    match result {
        Some(notification_template::Result::Value(v)) => {
            String::from_utf8_lossy(&v.content).into_owned()
        }
        Some(notification_template::Result::Failure(f)) => format!("failed {}", f.code),
        _ => String::new(),
    }
}

/// One attempt of `request` at `now`. `execute` runs the side effect of the `ctx.run` with
/// this completion id and returns its result. An error names a journal this program cannot
/// have written (a replay that does not line up).
pub fn play(
    request: &AttemptRequest,
    now: u64,
    mut execute: impl FnMut(u32) -> Bytes,
) -> Result<Turn, String> {
    let mut commands = Vec::new();
    let mut results = HashMap::new();
    for frame in &request.journal {
        let kind = MessageType::from_id(frame.ty).map(MessageType::kind);
        if kind == Some(Kind::Notification) {
            let n = proto::NotificationTemplate::decode(Bytes::clone(&frame.payload))
                .map_err(|e| format!("undecodable notification: {e}"))?;
            if let Some(notification_template::Id::CompletionId(id)) = n.id {
                results.insert(id, n.result);
            }
        } else if kind == Some(Kind::Command) {
            commands.push(Message::decode(frame, request.protocol).map_err(|e| e.to_string())?);
        }
    }
    let program = match commands.first() {
        Some(Message::Input(input)) => input.value.clone().unwrap_or_default().content,
        other => return Err(format!("the journal starts with {other:?}, not the input")),
    };
    let mut messages = Vec::new();
    let mut outputs = Vec::new();
    let mut completion = 1;
    // Command 0 is the input.
    for (next_command, &step) in (1..).zip(program.iter()) {
        let replayed = commands.get(next_command);
        if let Some(command) = replayed
            && !matches(step, command, completion)
        {
            return Err(format!(
                "command {next_command} is {command:?}, the program has step '{}' there",
                step as char
            ));
        }
        let fresh = replayed.is_none();
        let awaited = match step {
            // A side effect (`r`), or a cost report (`k`, a `sluice:cost` run whose result is
            // what it spent: no side effect, proposed as it is).
            b'r' | b'k' => {
                let id = completion;
                completion += 1;
                let cost = step == b'k';
                if fresh {
                    messages.push(Message::Run(proto::RunCommandMessage {
                        result_completion_id: id,
                        name: if cost {
                            super::super::model::cost::COST_RUN.into()
                        } else {
                            String::new()
                        },
                    }));
                }
                if !results.contains_key(&id) {
                    let value = if cost {
                        Bytes::from(cost_of(id).to_string())
                    } else {
                        execute(id)
                    };
                    messages.push(Message::ProposeRunCompletion(
                        proto::ProposeRunCompletionMessage {
                            result_completion_id: id,
                            result: Some(proto::propose_run_completion_message::Result::Value(
                                value,
                            )),
                        },
                    ));
                }
                id
            }
            b's' => {
                let id = completion;
                completion += 1;
                if fresh {
                    messages.push(Message::Sleep(proto::SleepCommandMessage {
                        wake_up_time: now.saturating_add(u64::from(id) * 700),
                        result_completion_id: id,
                        name: String::new(),
                    }));
                }
                id
            }
            b'c' => {
                let id = completion + 1;
                if fresh {
                    messages.push(Message::Call(proto::CallCommandMessage {
                        service_name: LEAF.into(),
                        handler_name: "run".into(),
                        parameter: Bytes::from_static(b"r"),
                        invocation_id_notification_idx: completion,
                        result_completion_id: id,
                        ..proto::CallCommandMessage::default()
                    }));
                }
                completion += 2;
                id
            }
            b'w' => {
                if fresh {
                    messages.push(Message::SetState(proto::SetStateCommandMessage {
                        key: state_key(request.invocation_id),
                        value: Some(proto::Value {
                            content: Bytes::from_static(b"1"),
                        }),
                        name: String::new(),
                    }));
                }
                continue;
            }
            other => return Err(format!("unknown step '{}'", other as char)),
        };
        match results.get(&awaited) {
            Some(result) => outputs.push(result_text(result.as_ref())),
            None => {
                return Ok(Turn {
                    messages,
                    ending: suspend(awaited),
                });
            }
        }
    }
    messages.push(Message::Output(proto::OutputCommandMessage {
        name: String::new(),
        result: Some(output_command_message::Result::Value(proto::Value {
            content: outputs.join(",").into(),
        })),
    }));
    Ok(Turn {
        messages,
        ending: Ending::End,
    })
}

/// What the `k` step with completion id `id` reports it spent.
pub fn cost_of(id: u32) -> u64 {
    u64::from(id) * 7
}

/// The state key a `w` step of invocation `id` writes.
pub fn state_key(id: InvocationId) -> Bytes {
    Bytes::from(format!("seen-{id}"))
}
