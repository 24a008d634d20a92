//! Field-shape validation of records the hypervisor describes (docs/contract.md §7).
//!
//! At start-up a violation aborts seeding; during reconcile the record is skipped with a
//! warning. Unlike the reference, non-finite prices are rejected (certification B802 needs
//! a finite price).

use crate::machine::{CapacityType, Machine, MachineState};

/// Why a described record cannot be served.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidMachine {
    /// `instance_type` is empty.
    #[error("machine {id}: instance_type is empty")]
    MissingInstanceType {
        /// The machine.
        id: String,
    },
    /// `capacity_type` is unspecified.
    #[error("machine {id}: capacity_type is unspecified")]
    MissingCapacityType {
        /// The machine.
        id: String,
    },
    /// `zone` is empty while the provider is multi-zone.
    #[error("machine {id}: zone is empty but this provider requires one")]
    MissingZone {
        /// The machine.
        id: String,
    },
    /// The price is NaN, infinite or negative.
    #[error("machine {id}: price_per_hour {price} must be finite and at least 0")]
    BadPrice {
        /// The machine.
        id: String,
        /// The offending price.
        price: f64,
    },
    /// The interruption probability is NaN or outside [0, 1].
    #[error("machine {id}: interruption_probability {probability} must be within [0, 1]")]
    BadProbability {
        /// The machine.
        id: String,
        /// The offending probability.
        probability: f64,
    },
    /// A SPOT machine declares no interruption probability.
    #[error("machine {id}: SPOT capacity needs an interruption_probability above 0")]
    SpotWithoutProbability {
        /// The machine.
        id: String,
    },
    /// Described records may only be Speculative without a host or Idle with one.
    #[error(
        "machine {id}: a described machine must be Speculative without a host or Idle with one (got {state} {host})"
    )]
    BadState {
        /// The machine.
        id: String,
        /// The state it was described in.
        state: MachineState,
        /// "with a host" or "without a host".
        host: &'static str,
    },
    /// The same id was described twice at seeding.
    #[error("machine {id}: described twice")]
    Duplicate {
        /// The machine.
        id: String,
    },
}

/// Checks one described record.
///
/// # Errors
/// The first rule the record breaks, in the order of docs/contract.md §7.
pub fn validate_instance(machine: &Machine, require_zone: bool) -> Result<(), InvalidMachine> {
    let id = machine.id.to_string();
    if machine.instance_type.is_empty() {
        return Err(InvalidMachine::MissingInstanceType { id });
    }
    if machine.capacity_type == CapacityType::Unspecified {
        return Err(InvalidMachine::MissingCapacityType { id });
    }
    if require_zone && machine.zone.is_empty() {
        return Err(InvalidMachine::MissingZone { id });
    }
    let price = machine.price_per_hour;
    if !price.is_finite() || price < 0.0 {
        return Err(InvalidMachine::BadPrice { id, price });
    }
    let probability = machine.interruption_probability;
    if !(0.0..=1.0).contains(&probability) {
        return Err(InvalidMachine::BadProbability { id, probability });
    }
    if machine.capacity_type == CapacityType::Spot && probability <= 0.0 {
        return Err(InvalidMachine::SpotWithoutProbability { id });
    }
    let shape_ok = match machine.state {
        MachineState::Speculative => !machine.has_host(),
        MachineState::Idle => machine.has_host(),
        _ => false,
    };
    if !shape_ok {
        let host = if machine.has_host() {
            "with a host"
        } else {
            "without a host"
        };
        return Err(InvalidMachine::BadState {
            id,
            state: machine.state,
            host,
        });
    }
    Ok(())
}
