//! The `Hypervisor` contract suites: every MUST the trait documents, checked through the
//! trait, plus a probe of the substrate (outside the port) for what `describe` cannot show,
//! such as a stopped domain or a volume a failed Create left behind.

use std::collections::BTreeSet;
use std::sync::Arc;

use bigfleet_libvirt_domain::{
    HostRef, Machine, MachineId, MachineState, OperationId, validate_instance,
};
use futures::future::BoxFuture;

use crate::hypervisor::{
    BootstrapBlob, ConfigureRequest, CreateRequest, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError, ReadinessRequest,
};

/// Names of everything the substrate holds for a machine (its domain, its volumes), in any
/// stable order; empty when it holds nothing. Each implementation's test provides it.
pub type Residue = Box<dyn Fn(&Machine) -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// What an implementation can legitimately not do, so the suite checks the documented
/// alternative instead of skipping.
#[derive(Clone, Copy, Debug)]
pub struct HypervisorCaps {
    /// Whether a guest runs the bootstrap and drain hooks. When false (libvirt's test driver
    /// has no guest agent), `configure` and `drain` MUST fail with a message rather than
    /// report a success that did not happen.
    pub bootstrap: bool,
}

/// A blob text that must never appear in an error message.
const SECRET: &str = "contract-secret-blob-7f3a";

fn op(name: &str) -> OperationId {
    OperationId::from_stored(format!("contract-{name}"))
}

fn in_state(machine: &Machine, state: MachineState, host: Option<HostRef>) -> Arc<Machine> {
    let mut record = machine.clone();
    record.state = state;
    record.host = host;
    Arc::new(record)
}

fn create_request(slot: &Machine, operation: &str) -> CreateRequest {
    CreateRequest {
        machine: in_state(slot, MachineState::Creating, None),
        operation_id: op(operation),
    }
}

async fn delete<H: Hypervisor>(
    hv: &H,
    slot: &Machine,
    host: Option<HostRef>,
    what: &str,
) -> Result<(), HypervisorError> {
    let request = DeleteRequest {
        machine: in_state(slot, MachineState::Deleting, host),
        operation_id: op(what),
    };
    hv.delete(request).await
}

/// Describes, checking the shape rules every described record MUST follow.
async fn described<H: Hypervisor>(hv: &H, when: &str) -> Vec<Machine> {
    let machines = hv
        .describe()
        .await
        .unwrap_or_else(|e| panic!("describe {when}: {e}"));
    let mut ids = BTreeSet::new();
    for machine in &machines {
        assert!(
            ids.insert(machine.id.clone()),
            "describe {when} listed {} twice",
            machine.id
        );
        if let Err(e) = validate_instance(machine, true) {
            panic!("describe {when}: a record breaks the field-shape rules: {e}");
        }
        match machine.state {
            MachineState::Speculative | MachineState::Idle => {}
            other => panic!(
                "describe {when} must report substrate truth only (Speculative or Idle), \
                 not {other:?} for {}",
                machine.id
            ),
        }
    }
    machines
}

fn find<'a>(machines: &'a [Machine], id: &MachineId) -> Option<&'a Machine> {
    machines.iter().find(|m| &m.id == id)
}

/// The `Hypervisor` contract on a substrate with at least three open slots and nothing else
/// of this provider's: describe lists the slots in shape; Create of a slot returns a set
/// host, describe then shows it Idle there, and a retry with the same operation id adopts
/// it (same host, nothing more on the substrate); Configure and Drain on the created
/// machine (or, without a guest, clear failures that never echo the blob); Drain is
/// idempotent; Delete removes everything, is idempotent, and succeeds for a machine that
/// was never created (the compensating Delete, without a host); a slot is reusable after
/// Delete; a Create whose future is dropped mid-call leaves the substrate consistent, so
/// its retry adopts what it made and a Delete then cleans all of it.
///
/// # Panics
/// When the implementation breaks its contract.
pub async fn hypervisor_contract<H: Hypervisor>(hv: &H, caps: HypervisorCaps, residue: &Residue) {
    let slots = open_slots(hv, residue).await;
    let slot = &slots[0];
    let (host, made) = create_and_adopt(hv, residue, slot).await;
    configure_and_drain(hv, caps, slot, &host).await;
    delete_twice_and_reuse(hv, residue, slot, host).await;
    // The compensating Delete of a Create that made nothing carries no host.
    let never = &slots[1];
    delete(hv, never, None, "delete-never")
        .await
        .unwrap_or_else(|e| panic!("delete of a machine that was never created: {e}"));
    assert!(residue(never).await.is_empty(), "and it makes nothing");

    dropped_create(hv, residue, &slots[2], made.len()).await;
}

/// Configure, readiness and Drain on a created machine.
async fn configure_and_drain<H: Hypervisor>(
    hv: &H,
    caps: HypervisorCaps,
    slot: &Machine,
    host: &HostRef,
) {
    let mut configuring = Machine::clone(&in_state(slot, MachineState::Configuring, None));
    configuring.host = Some(host.clone());
    configuring.cluster = "contract-cluster".to_owned();
    let configuring = Arc::new(configuring);
    let configure = ConfigureRequest {
        machine: Arc::clone(&configuring),
        cluster_id: "contract-cluster".to_owned(),
        bootstrap_blob: BootstrapBlob::new(SECRET.as_bytes().to_vec()),
        operation_id: op("configure-1"),
    };
    let configured = hv.configure(configure).await;
    let draining = in_state(&configuring, MachineState::Draining, Some(host.clone()));
    let drain = |name: &str| DrainRequest {
        machine: Arc::clone(&draining),
        grace_period_seconds: 30,
        operation_id: op(name),
    };
    if caps.bootstrap {
        configured.unwrap_or_else(|e| panic!("configure of the created machine: {e}"));
        let ready = ReadinessRequest {
            machine: configuring,
            cluster_id: "contract-cluster".to_owned(),
            operation_id: op("configure-1"),
        };
        hv.confirm_node_ready(ready)
            .await
            .unwrap_or_else(|e| panic!("confirm_node_ready after configure: {e}"));
        hv.drain(drain("drain-1"))
            .await
            .unwrap_or_else(|e| panic!("drain of the configured machine: {e}"));
        hv.drain(drain("drain-1"))
            .await
            .unwrap_or_else(|e| panic!("drain must be idempotent: {e}"));
    } else {
        let error = configured.expect_err("configure without a guest must fail, not pretend");
        assert!(!error.message.is_empty(), "the failure says why");
        assert!(
            !error.message.contains(SECRET),
            "configure must never echo the blob: {}",
            error.message
        );
        let error = hv
            .drain(drain("drain-1"))
            .await
            .expect_err("drain without a guest must fail, not pretend");
        assert!(!error.message.is_empty(), "the failure says why");
    }
}

/// A Create whose future is dropped after its first poll, then retried.
async fn dropped_create<H: Hypervisor>(hv: &H, residue: &Residue, slot: &Machine, made: usize) {
    let mut first = Box::pin(hv.create(create_request(slot, "create-dropped")));
    let polled = futures::poll!(first.as_mut());
    drop(first);
    let retried = hv
        .create(create_request(slot, "create-dropped"))
        .await
        .unwrap_or_else(|e| {
            panic!("the retry of a create dropped mid-call ({polled:?}) must succeed: {e}")
        });
    assert_eq!(
        residue(slot).await.len(),
        made,
        "a dropped create and its retry make one machine, no more"
    );
    let after = described(hv, "after the dropped create's retry").await;
    let record = find(&after, &slot.id).expect("describe lists the slot");
    assert_eq!(record.state, MachineState::Idle);
    delete(hv, slot, Some(retried.host), "delete-dropped")
        .await
        .unwrap_or_else(|e| panic!("delete after a dropped create: {e}"));
    assert!(
        residue(slot).await.is_empty(),
        "and the delete cleans all of it"
    );
}

/// The `Hypervisor` contract for a Create that fails: `slot` (an open slot whose Create the
/// test arranged to fail) MUST fail with a message, leave the substrate exactly as it was
/// (what this attempt made is rolled back), and not be described as Idle. Returns the
/// error, so the caller can check the failure came from the step it arranged.
///
/// # Panics
/// When the implementation breaks its contract.
pub async fn failed_create_contract<H: Hypervisor>(
    hv: &H,
    residue: &Residue,
    slot: &Machine,
) -> HypervisorError {
    let before = residue(slot).await;
    let error = hv
        .create(create_request(slot, "create-fails"))
        .await
        .expect_err("the arranged create must fail");
    assert!(!error.message.is_empty(), "a failed create says why");
    assert_eq!(
        residue(slot).await,
        before,
        "a failed create must leave nothing behind ({})",
        error.message
    );
    let after = described(hv, "after a failed create").await;
    if let Some(record) = find(&after, &slot.id) {
        assert_ne!(
            record.state,
            MachineState::Idle,
            "a failed create must not leave a running machine"
        );
    }
    error
}

/// The open slots of a first describe, checking every record's host matches its state.
async fn open_slots<H: Hypervisor>(hv: &H, residue: &Residue) -> Vec<Machine> {
    let before = described(hv, "before any call").await;
    let slots: Vec<Machine> = before
        .iter()
        .filter(|m| m.state == MachineState::Speculative)
        .cloned()
        .collect();
    assert!(
        slots.len() >= 3,
        "the suite needs three open slots; describe offered {}",
        slots.len()
    );
    for machine in &before {
        if machine.state == MachineState::Idle {
            assert!(
                machine.host.as_ref().is_some_and(HostRef::is_set),
                "an Idle record must carry its host ({})",
                machine.id
            );
        } else {
            assert!(
                machine.host.is_none(),
                "a Speculative record must have no host ({})",
                machine.id
            );
        }
    }
    assert!(
        residue(&slots[0]).await.is_empty(),
        "the suite needs a substrate holding nothing for {}",
        slots[0].id
    );
    slots
}

/// Creates `slot`, then retries with the same operation id; returns the host and what the
/// substrate holds for it.
async fn create_and_adopt<H: Hypervisor>(
    hv: &H,
    residue: &Residue,
    slot: &Machine,
) -> (HostRef, Vec<String>) {
    let before = described(hv, "before create").await;
    let created = hv
        .create(create_request(slot, "create-1"))
        .await
        .unwrap_or_else(|e| panic!("create of open slot {}: {e}", slot.id));
    assert!(
        created.host.is_set(),
        "a successful create must return a set host"
    );
    let made = residue(slot).await;
    assert!(!made.is_empty(), "the probe must see what create made");
    let after = described(hv, "after create").await;
    assert_eq!(
        after.len(),
        before.len(),
        "create must not change the slot list"
    );
    let record = find(&after, &slot.id).expect("describe still lists the created slot");
    assert_eq!(
        record.state,
        MachineState::Idle,
        "a created machine describes as Idle"
    );
    assert_eq!(
        record.host.as_ref(),
        Some(&created.host),
        "describe shows where it runs"
    );
    let retried = hv
        .create(create_request(slot, "create-1"))
        .await
        .unwrap_or_else(|e| panic!("a retried create must adopt, not fail: {e}"));
    assert_eq!(
        retried.host, created.host,
        "a retried create adopts the same machine"
    );
    assert_eq!(
        residue(slot).await,
        made,
        "a retried create must never create a second machine"
    );

    (created.host, made)
}

/// Deletes the created machine twice, then checks the slot is open and reusable.
async fn delete_twice_and_reuse<H: Hypervisor>(
    hv: &H,
    residue: &Residue,
    slot: &Machine,
    created: HostRef,
) {
    let host = Some(created);
    delete(hv, slot, host.clone(), "delete-1")
        .await
        .unwrap_or_else(|e| panic!("delete of the created machine: {e}"));
    assert!(
        residue(slot).await.is_empty(),
        "delete must remove the machine and its volumes"
    );
    let after = described(hv, "after delete").await;
    let record = find(&after, &slot.id).expect("describe offers the deleted slot again");
    assert_eq!(
        record.state,
        MachineState::Speculative,
        "a deleted slot is open again"
    );
    assert!(record.host.is_none(), "an open slot has no host");
    delete(hv, slot, host, "delete-1")
        .await
        .unwrap_or_else(|e| panic!("delete must be idempotent (machine already gone): {e}"));
    let again = hv
        .create(create_request(slot, "create-2"))
        .await
        .unwrap_or_else(|e| panic!("a slot must be reusable after delete: {e}"));
    delete(hv, slot, Some(again.host), "delete-2")
        .await
        .unwrap_or_else(|e| panic!("delete of the re-created machine: {e}"));
    assert!(
        residue(slot).await.is_empty(),
        "the second delete cleaned up too"
    );
}
