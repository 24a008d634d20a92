//! Driving the real provider over gRPC: a call's ack, then Get every 5 ms until the machine
//! reaches the state the call leads to. A machine that fails, or does not get there within
//! [`BOOT`], is an error (the benchmark fails only on errors, never on timings).

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::BoxError;
use crate::harness::{Client, configure, create, delete, get, state};

/// The longest any one call may take to reach its state (a TCG host under load is slow).
pub const BOOT: Duration = Duration::from_secs(240);
const POLL: Duration = Duration::from_millis(5);

/// One call's timings.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// Acked → the machine is in the call's target state.
    pub done: Duration,
    /// When the target state was seen.
    pub at: Instant,
}

/// Polls Get until `id` is in `want`; returns when it was seen.
pub async fn reach(c: &mut Client, id: &str, want: S) -> Result<Instant, BoxError> {
    let start = Instant::now();
    loop {
        let machine = get(c, id).await.map_err(|e| format!("Get {id}: {e}"))?;
        let now = Instant::now();
        match state(&machine) {
            s if s == want => return Ok(now),
            S::Failed => {
                return Err(
                    format!("{id} failed on the way to {want:?}: {}", machine.last_error).into(),
                );
            }
            s if start.elapsed() > BOOT => {
                return Err(format!("{id} is still {s:?}, not {want:?}, after {BOOT:?}").into());
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

/// Create, then Idle.
pub async fn create_timed(mut c: Client, id: String) -> Result<Timed, BoxError> {
    create(&mut c, &id, None)
        .await
        .map_err(|e| format!("Create {id}: {e}"))?;
    let acked = Instant::now();
    let at = reach(&mut c, &id, S::Idle).await?;
    Ok(Timed {
        done: at - acked,
        at,
    })
}

/// Delete, then Speculative.
pub async fn delete_timed(mut c: Client, id: String) -> Result<Timed, BoxError> {
    delete(&mut c, &id, None)
        .await
        .map_err(|e| format!("Delete {id}: {e}"))?;
    let acked = Instant::now();
    let at = reach(&mut c, &id, S::Speculative).await?;
    Ok(Timed {
        done: at - acked,
        at,
    })
}

/// Configure (acked only: the guest's agent never answers, so it stays Configuring).
pub async fn configure_acked(mut c: Client, id: String) -> Result<(), BoxError> {
    configure(&mut c, &id, "bench-cluster", &[], None)
        .await
        .map(|_| ())
        .map_err(|e| format!("Configure {id}: {e}").into())
}

/// Runs `call` on every id at once; the results in id order.
pub async fn all<F, Fut>(c: &Client, ids: &[String], call: F) -> Result<Vec<Timed>, BoxError>
where
    F: Fn(Client, String) -> Fut,
    Fut: std::future::Future<Output = Result<Timed, BoxError>> + Send + 'static,
{
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| tokio::spawn(call(c.clone(), id.clone())))
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await??);
    }
    Ok(out)
}

/// Runs `call` over `ids` with `width` workers (each takes the next id in turn); returns
/// the results and the wall time of all.
pub async fn wide<F, Fut>(
    c: &Client,
    ids: &[String],
    width: usize,
    call: F,
) -> Result<(Vec<Timed>, Duration), BoxError>
where
    F: Fn(Client, String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Timed, BoxError>> + Send + 'static,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..width)
        .map(|lane| {
            let (c, call) = (c.clone(), call.clone());
            let mine: Vec<String> = ids.iter().skip(lane).step_by(width).cloned().collect();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for id in mine {
                    out.push(call(c.clone(), id).await?);
                }
                Ok::<_, BoxError>(out)
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.extend(task.await??);
    }
    Ok((out, start.elapsed()))
}

/// The domain name in a machine's host reference (`<zone>/<domain>`).
pub async fn domain_of(c: &mut Client, id: &str) -> Result<String, BoxError> {
    let machine = get(c, id).await.map_err(|e| format!("Get {id}: {e}"))?;
    let host = machine.host.ok_or_else(|| format!("{id} has no host"))?;
    let (_, name) = host
        .r#ref
        .split_once('/')
        .ok_or_else(|| format!("{id}: host ref {:?} is not zone/domain", host.r#ref))?;
    Ok(name.to_owned())
}
