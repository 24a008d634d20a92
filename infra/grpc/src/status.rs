//! The only module that knows gRPC status codes.
//!
//! `FAILED_PRECONDITION` means a stale fencing token and nothing else: the shard treats it
//! as a zombie-shard incident and pages a human. An out-of-position call (Drain on a
//! Speculative machine, anything on a Failed one) is answered with `ABORTED` and a message
//! naming the current and the required state; the reference used `INTERNAL`, which reads
//! like a provider bug. A decision that could not be persisted is `UNAVAILABLE`: nothing was
//! acknowledged and the shard may retry. A call the caller's client identity does not allow
//! (mTLS, `--client-identity=enforce`) is `PERMISSION_DENIED`, never `FAILED_PRECONDITION`:
//! it is a wrong or misconfigured certificate, not a stale token.

use bigfleet_libvirt_domain::{Echo, GetIdError, MAX_ID_BYTES, MutateError};
use bigfleet_libvirt_ports::{ProviderError, StoreError};
use tonic::{Code, Status};

use bigfleet_libvirt_domain::authorization::Denial;

/// The status for a refused or failed mutating call. Every variant is matched explicitly so
/// a new one forces a decision here.
#[must_use]
pub fn for_provider_error(error: &ProviderError) -> Status {
    match error {
        ProviderError::Rejected(rejection) => for_rejection(rejection),
        ProviderError::Store(store) => for_store_error(store),
    }
}

fn for_rejection(error: &MutateError) -> Status {
    let code = match error {
        MutateError::MissingMachineId
        | MutateError::IdTooLong { .. }
        | MutateError::MissingClusterId => Code::InvalidArgument,
        MutateError::DeleteUnsupported => Code::Unimplemented,
        MutateError::Fenced { .. } => Code::FailedPrecondition,
        MutateError::NotFound { .. } => Code::NotFound,
        MutateError::OutOfPosition { .. } => Code::Aborted,
    };
    Status::new(code, error.to_string())
}

/// The status for an answer that could not be made durable.
#[must_use]
pub fn for_store_error(error: &StoreError) -> Status {
    match error {
        StoreError::Unusable { .. }
        | StoreError::Locked { .. }
        | StoreError::Io(_)
        | StoreError::AfterFailure(_) => {
            Status::unavailable(format!("the decision could not be persisted: {error}"))
        }
    }
}

/// The name of an answer's gRPC code as metric labels and logs show it (`OK`, `NotFound`,
/// `FailedPrecondition`, …): `None` is a success.
#[must_use]
pub fn outcome_name(error: Option<&Status>) -> &'static str {
    match error.map_or(Code::Ok, Status::code) {
        Code::Ok => "OK",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// A Get id the domain refuses before the lookup: empty, or longer than any machine's
/// (refused without echoing it).
#[must_use]
pub fn refused_get_id(error: GetIdError) -> Status {
    match error {
        GetIdError::Missing => Status::invalid_argument("id required"),
        GetIdError::Oversized(length) => Status::invalid_argument(format!(
            "id is {length} bytes; at most {MAX_ID_BYTES} are accepted (use a shorter id)"
        )),
    }
}

/// Get of an unknown id (echoed bounded).
#[must_use]
pub fn unknown_machine(id: &str) -> Status {
    Status::not_found(format!("machine {} not found", Echo(id)))
}

/// A call the caller's client identity does not allow; the message names the identity seen
/// and what the call needed.
#[must_use]
pub fn permission_denied(denial: &Denial) -> Status {
    Status::permission_denied(denial.to_string())
}

/// A handler panicked: the cause is logged, never echoed.
#[must_use]
pub fn internal() -> Status {
    Status::internal("internal error")
}

#[cfg(test)]
mod tests {
    use super::for_provider_error;
    use bigfleet_libvirt_domain::{FenceKey, FenceMark, Kind, MachineState, MutateError};
    use bigfleet_libvirt_ports::{ProviderError, StoreError};

    /// The label values stay what `{:?}` of the code printed before they became static.
    #[test]
    fn every_code_is_named_as_its_debug_form() {
        for n in 0..=16 {
            let code = tonic::Code::from_i32(n);
            let status = tonic::Status::new(code, "x");
            let expected = if code == tonic::Code::Ok {
                "OK".to_owned()
            } else {
                format!("{code:?}")
            };
            assert_eq!(super::outcome_name(Some(&status)), expected);
        }
        assert_eq!(super::outcome_name(None), "OK");
    }

    #[test]
    fn every_error_maps_to_its_documented_code() {
        let key = FenceKey {
            shard_id: "s".into(),
            machine_id: "m".into(),
        };
        let mark = FenceMark {
            epoch: 2,
            sequence: 5,
        };
        let cases: Vec<ProviderError> = vec![
            MutateError::MissingMachineId.into(),
            MutateError::IdTooLong {
                field: "shard_id",
                length: 1 << 20,
            }
            .into(),
            MutateError::MissingClusterId.into(),
            MutateError::DeleteUnsupported.into(),
            MutateError::Fenced {
                key,
                presented: FenceMark {
                    epoch: 1,
                    sequence: 9,
                },
                mark,
            }
            .into(),
            MutateError::NotFound {
                machine_id: "ghost".into(),
            }
            .into(),
            MutateError::NotFound {
                machine_id: format!("{}\n", "g".repeat(200)),
            }
            .into(),
            MutateError::OutOfPosition {
                machine_id: "m".into(),
                kind: Kind::Drain,
                state: MachineState::Speculative,
            }
            .into(),
            StoreError::Io("disk full".into()).into(),
            StoreError::Locked {
                path: "/var/lib/state.redb".into(),
            }
            .into(),
            StoreError::Unusable {
                path: "/x".into(),
                reason: "truncated".into(),
            }
            .into(),
        ];
        let table: String = cases
            .iter()
            .map(|e| {
                let status = for_provider_error(e);
                format!("{:?} | {}\n", status.code(), status.message())
            })
            .collect();
        insta::assert_snapshot!(table);
    }

    #[test]
    fn a_refused_identity_is_permission_denied_with_the_refusal_as_message() {
        use bigfleet_libvirt_domain::authorization::{Access, Seen, authorize};
        let denial = authorize(&Seen::Missing, "Get", Access::Read).unwrap_err();
        let status = super::permission_denied(&denial);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.message(), denial.to_string());
    }
}
