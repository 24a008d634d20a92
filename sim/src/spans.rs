//! What the provider's tracing spans looked like: a `tracing-subscriber` layer installed on
//! each run's thread (`scenario::run_plan`) that, for every `transition`, `compensation` and
//! `hypervisor` span opened, appends to the history the facts the `spans-in-call-trace`
//! checker judges (`checkers::spans`): the transition it is (or runs under), that
//! transition's nearest `rpc` ancestor, and whether it was opened while the provider was
//! starting. Like a fake it only records; it never judges.
//!
//! Deterministic: span ids come from the run's own registry, every span is opened by the
//! single madsim thread in event order, and no wall clock is read (time is madsim's). It
//! enables spans only, never events, so it costs no formatting; and it keeps nothing beyond
//! what the registry holds for live spans (each entry leaves the history when the checkers
//! next read it).

use std::sync::Arc;

use madsim::time::TimeHandle;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::history::{Event, Fields, SpanSeen};
use crate::world::World;

/// The span the simulator opens around building a provider process (`server::run_provider`):
/// the restore hand-off and the start-up compensation of failed Creates run in it, with no
/// call behind them.
pub const START_SPAN: &str = "provider_start";

/// A call's span (infra/grpc `CapacityService`).
const RPC: &str = "rpc";
/// An accepted transition's span (ports `start_transition`).
pub const TRANSITION: &str = "transition";
/// A compensating delete's span (ports `compensate`).
pub const COMPENSATION: &str = "compensation";
/// A hypervisor call's span (observe `InstrumentedHypervisor`).
pub const HYPERVISOR: &str = "hypervisor";

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field, format!("{value:?}"));
    }
}

impl Fields {
    fn set(&mut self, field: &Field, value: String) {
        match field.name() {
            "machine_id" => self.machine_id = Some(value),
            "kind" | "method" | "op" => self.what = Some(value),
            _ => {}
        }
    }
}

/// The layer; install it with `tracing_subscriber::registry().with(SpanWatch::new(world))`.
pub struct SpanWatch {
    world: Arc<World>,
}

impl SpanWatch {
    /// Records into `world`'s history.
    #[must_use]
    pub fn new(world: Arc<World>) -> Self {
        Self { world }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanWatch {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.is_span() {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.is_span()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        if ![RPC, TRANSITION, COMPENSATION, HYPERVISOR].contains(&name) {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let Some(span) = ctx.span(id) else {
            return;
        };
        if name == RPC || name == TRANSITION {
            span.extensions_mut().insert(fields.clone());
        }
        if name == RPC || TimeHandle::try_current().is_none() {
            return;
        }
        let mut transition: Option<(Fields, Option<Fields>)> = None;
        let mut at_start = false;
        for ancestor in span.scope() {
            match ancestor.name() {
                TRANSITION if transition.is_none() => {
                    let seen = ancestor.extensions().get::<Fields>().cloned();
                    transition = Some((seen.unwrap_or_default(), None));
                }
                RPC => {
                    if let Some((_, rpc)) = &mut transition
                        && rpc.is_none()
                    {
                        *rpc = ancestor.extensions().get::<Fields>().cloned();
                    }
                }
                START_SPAN => at_start = true,
                _ => {}
            }
        }
        self.world.record(Event::Span(SpanSeen {
            name,
            fields,
            transition,
            at_start,
        }));
    }
}
