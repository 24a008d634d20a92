//! A shard incarnation's calls: each mints a fresh token per attempt (transport retries
//! are never replays), goes through the simulated network, is traced, and is recorded in
//! the history with what the shard sent and learned, for the checkers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_domain::{FenceMark, Kind, StringMap};
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::history::Event;
use crate::net::{self, Answer, Client, Outcome, Rpc};
use crate::rng::SimRng;
use crate::world::World;

/// What a mutating call asks for beyond its kind.
#[derive(Clone, Debug)]
pub enum Payload {
    /// Nothing (Create, Delete).
    None,
    /// Configure's binding.
    Configure {
        /// The cluster id.
        cluster: String,
        /// The shard metadata.
        metadata: StringMap,
    },
    /// Drain's grace period.
    Drain(i64),
}

/// One process of one shard: its epoch and per-process sequence counter.
pub struct Incarnation {
    /// The world.
    pub world: Arc<World>,
    /// The shard's index.
    pub shard: usize,
    /// The shard id on the wire.
    pub name: String,
    /// The persisted epoch of this process.
    pub epoch: i64,
    sequence: Mutex<i64>,
    /// This incarnation's decision stream.
    pub rng: Mutex<SimRng>,
    /// Machines with a mutation in flight from this process.
    pub in_flight: Mutex<std::collections::BTreeSet<String>>,
    /// The last full List this process saw.
    pub view: Mutex<BTreeMap<String, pb::Machine>>,
    /// When this process became a zombie and when it stops.
    pub zombie_until: Mutex<Option<std::time::Duration>>,
}

impl Incarnation {
    /// A new process of shard `shard` with `epoch`.
    #[must_use]
    pub fn new(world: Arc<World>, shard: usize, epoch: i64) -> Self {
        let rng = SimRng::stream(world.plan.seed, &format!("shard-{shard}-epoch-{epoch}"));
        Self {
            world,
            shard,
            name: format!("shard-{shard}"),
            epoch,
            sequence: Mutex::new(0),
            rng: Mutex::new(rng),
            in_flight: Mutex::default(),
            view: Mutex::default(),
            zombie_until: Mutex::new(None),
        }
    }

    fn mint(&self) -> FenceMark {
        let mut sequence = self.sequence.lock().expect("sequence lock");
        *sequence += 1;
        FenceMark {
            epoch: self.epoch,
            sequence: *sequence,
        }
    }

    fn tag(&self) -> String {
        format!("{}/e{}", self.name, self.epoch)
    }

    /// One attempt of a mutating call with a freshly minted token.
    pub async fn mutate(&self, id: &str, kind: Kind, payload: &Payload) -> Outcome {
        let token = self.mint();
        let scope = (self.name.clone(), id.to_owned());
        let sent = self.world.record(Event::Sent { scope, token });
        // The execute pool draws sequence numbers in order but sends them racily.
        let race = self.rng.lock().expect("rng lock").duration(
            std::time::Duration::ZERO,
            std::time::Duration::from_millis(5),
        );
        madsim::time::sleep(race).await;
        let rpc = self.request(id, kind, token, payload);
        let (tag, (e, s)) = (self.tag(), (token.epoch, token.sequence));
        self.world.trace(format!("{tag} -> {kind} {id} ({e},{s})"));
        let outcome = net::call(&self.world, Client::Shard(self.shard), rpc).await;
        self.world.trace(format!(
            "{tag} <- {kind} {id} ({e},{s}) {}",
            describe(&outcome)
        ));
        let binding = match payload {
            Payload::Configure { cluster, metadata } => Some((cluster.clone(), metadata.clone())),
            _ => None,
        };
        let reply = match &outcome {
            Outcome::Answered(reply) => Some(reply.clone()),
            Outcome::Refused | Outcome::Indefinite(_) => None,
        };
        self.world.record(Event::Mutated {
            sent,
            kind,
            reply,
            binding,
        });
        outcome
    }

    fn request(&self, id: &str, kind: Kind, token: FenceMark, payload: &Payload) -> Rpc {
        let (machine_id, shard_id) = (id.to_owned(), self.name.clone());
        let (shard_epoch, sequence_number) = (token.epoch, token.sequence);
        match (kind, payload) {
            (Kind::Create, _) => Rpc::Create(pb::CreateRequest {
                machine_id,
                shard_id,
                shard_epoch,
                sequence_number,
            }),
            (Kind::Configure, Payload::Configure { cluster, metadata }) => {
                Rpc::Configure(pb::ConfigureRequest {
                    machine_id,
                    cluster_id: cluster.clone(),
                    bootstrap_blob: format!("#!bootstrap {cluster}").into_bytes(),
                    shard_metadata: metadata.clone().into_iter().collect(),
                    shard_id,
                    shard_epoch,
                    sequence_number,
                })
            }
            (Kind::Configure, _) => unreachable!("a Configure carries its binding"),
            (Kind::Drain, payload) => Rpc::Drain(pb::DrainRequest {
                machine_id,
                grace_period_seconds: match payload {
                    Payload::Drain(grace) => *grace,
                    _ => 30,
                },
                shard_id,
                shard_epoch,
                sequence_number,
            }),
            (Kind::Delete, _) => Rpc::Delete(pb::DeleteRequest {
                machine_id,
                shard_id,
                shard_epoch,
                sequence_number,
            }),
        }
    }

    /// A Get; the answer updates the view.
    pub async fn get(&self, id: &str) -> Option<pb::Machine> {
        let rpc = Rpc::Get(pb::MachineRef { id: id.to_owned() });
        let outcome = net::call(&self.world, Client::Shard(self.shard), rpc).await;
        let Outcome::Answered(Ok(Answer::Machine(machine))) = outcome else {
            return None;
        };
        self.world.record(Event::Got(machine.clone()));
        self.view
            .lock()
            .expect("view lock")
            .insert(machine.id.clone(), machine.clone());
        Some(machine)
    }

    /// A full List; the answer replaces the view.
    pub async fn refresh(&self) -> bool {
        let sent = self.world.record(Event::Listing);
        let rpc = Rpc::List(pb::ListFilter::default());
        let outcome = net::call(&self.world, Client::Shard(self.shard), rpc).await;
        let list = match outcome {
            Outcome::Answered(Ok(Answer::List(list))) => Some(list),
            _ => None,
        };
        let cursor = None;
        let answered = list.clone();
        self.world.record(Event::Listed { sent, list, cursor });
        let Some(list) = answered else {
            return false;
        };
        let view = list
            .machines
            .into_iter()
            .map(|m| (m.id.clone(), m))
            .collect();
        *self.view.lock().expect("view lock") = view;
        true
    }
}

/// A one-word summary of an outcome for the trace.
#[must_use]
pub fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Answered(Ok(Answer::Ack(ack))) => {
            let state = ack
                .machine
                .as_ref()
                .and_then(|m| pb::MachineState::try_from(m.state).ok())
                .map_or("?", |s| s.as_str_name());
            format!("OK {} {state}", ack.operation_id)
        }
        Outcome::Answered(Ok(_)) => "OK".to_owned(),
        Outcome::Answered(Err(status)) => format!("{:?}", status.code()),
        Outcome::Refused => "refused".to_owned(),
        Outcome::Indefinite(why) => format!("indefinite ({why})"),
    }
}
