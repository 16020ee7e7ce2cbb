//! Signal: an awakeable's completion (over the ingress or from a handler) or a SendSignal for
//! an invocation. It is journaled once per awakeable, at most
//! `ingress.max-awakeable-completions` per invocation, and a suspended invocation is attempted
//! again only if it waits on it.

use super::super::model::effect::Effect;
use super::super::model::signals::{
    Delivery, FIRST_AWAKEABLE_INDEX, Signal, completed_awakeables, signal_len,
};
use super::super::task::Partition;
use sluice_protocol::Message;
use sluice_protocol::proto::{self, notification_template};
use sluice_store::invocation::Status;
use sluice_store::storage::writer::WriteSet;

impl Partition {
    /// Delivers `signal` to its invocation's journal. An awakeable completes once, and an
    /// invocation takes at most `ingress.max-awakeable-completions` of them: a client that
    /// forges awakeable ids cannot grow a journal without bound.
    pub(in super::super) fn signal(
        &mut self,
        signal: Signal,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Delivery {
        let cap = self.outside.config.ingress.max_awakeable_completions;
        let Some(live) = self.live.get_mut(&signal.target) else {
            // A completed invocation left memory but exists; it no longer listens.
            return match self.stored(signal.target).ok().flatten() {
                Some(_) => Delivery::Refused(format!(
                    "invocation {} has completed: its awakeables can no longer be completed",
                    signal.target
                )),
                None => Delivery::NoInvocation,
            };
        };
        if live.record().status == Status::Completed {
            return Delivery::Refused(format!(
                "invocation {} has completed: its awakeables can no longer be completed",
                signal.target
            ));
        }
        if let notification_template::Id::SignalId(index) = signal.id
            && index >= FIRST_AWAKEABLE_INDEX
        {
            let mut count = 0u32;
            let mut bytes = signal_len(&signal);
            for (done, len) in completed_awakeables(&live.journal) {
                bytes = bytes.saturating_add(len);
                if done == index {
                    return Delivery::Refused(format!(
                        "awakeable {index} of invocation {} was already completed: an awakeable completes once",
                        signal.target
                    ));
                }
                count = count.saturating_add(1);
            }
            if count >= cap {
                return Delivery::Refused(format!(
                    "invocation {} has taken {count} awakeable completions, the most it accepts (ingress.max-awakeable-completions)",
                    signal.target
                ));
            }
            let max_bytes = self
                .outside
                .config
                .ingress
                .max_awakeable_completion_bytes
                .as_usize();
            if bytes > max_bytes {
                return Delivery::Refused(format!(
                    "invocation {} would hold {bytes} bytes of awakeable completions, more than it accepts ({max_bytes}, ingress.max-awakeable-completion-bytes)",
                    signal.target
                ));
            }
        }
        let signal_id = signal.id.clone();
        let frame = Message::Signal(proto::NotificationTemplate {
            id: Some(signal.id),
            result: Some(signal.result),
        })
        .to_frame(false);
        super::super::journal::append_signal(live, writes, frame, effects);
        // A suspension that does not wait on it stays suspended: forged completions of
        // awakeables nobody awaits cannot make it replay its journal again and again.
        let awaited = live
            .run()
            .awaiting()
            .is_none_or(|waits| waits.wants(&signal_id));
        if !live.running() && live.record().status != Status::Paused && awaited {
            effects.push(Effect::Attempt(signal.target));
        }
        Delivery::Delivered
    }
}
