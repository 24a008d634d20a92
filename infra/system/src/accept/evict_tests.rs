//! The eviction rule on its own: oldest idle first, busy and unflushed connections never,
//! one eviction outstanding at a time, the linger after a response, the wake-up.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::{Eviction, Registry};

fn leases(registry: &Arc<Registry>, n: usize) -> Vec<super::Lease> {
    let permits = Arc::new(Semaphore::new(n));
    (0..n)
        .map(|_| registry.lease(Arc::clone(&permits).try_acquire_owned().unwrap()))
        .collect()
}

#[test]
fn the_oldest_idle_connection_is_evicted_and_busy_ones_never_are() {
    let registry = Arc::new(Registry::default());
    let open = leases(&registry, 3);
    // The oldest is serving a request, the second has a response going out.
    let busy = open[0].activity().begin();
    open[1].activity().wrote();
    assert!(matches!(
        registry.evict_oldest_idle(),
        Eviction::Evicted { .. }
    ));
    assert!(!open[0].activity().is_evicted());
    assert!(!open[1].activity().is_evicted());
    assert!(open[2].activity().is_evicted());
    // One eviction at a time: the next waits until the evicted connection has closed.
    assert_eq!(registry.evict_oldest_idle(), Eviction::Closing);
    let mut open = open;
    drop(open.pop());
    assert_eq!(registry.open(), 2);
    assert_eq!(registry.evict_oldest_idle(), Eviction::AllBusy);
    // Flushed, the second is idle again (it never served a request, so no linger).
    open[1].activity().flushed();
    assert!(matches!(
        registry.evict_oldest_idle(),
        Eviction::Evicted { .. }
    ));
    assert!(open[1].activity().is_evicted());
    drop(open.pop());
    // A response that just ended lingers before its connection counts as idle.
    drop(busy);
    assert_eq!(registry.evict_oldest_idle(), Eviction::AllBusy);
}

#[test]
fn a_connection_idle_past_the_linger_is_evicted() {
    let registry = Arc::new(Registry::default());
    let open = leases(&registry, 1);
    drop(open[0].activity().begin());
    assert_eq!(registry.evict_oldest_idle(), Eviction::AllBusy);
    std::thread::sleep(super::LINGER + Duration::from_millis(20));
    assert!(matches!(
        registry.evict_oldest_idle(),
        Eviction::Evicted { .. }
    ));
}

#[tokio::test]
async fn eviction_wakes_a_connection_still_opening() {
    let registry = Arc::new(Registry::default());
    let open = leases(&registry, 1);
    let activity = open[0].activity();
    let waiting = tokio::spawn(async move { activity.evicted().await });
    tokio::task::yield_now().await;
    assert!(matches!(
        registry.evict_oldest_idle(),
        Eviction::Evicted { .. }
    ));
    tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the eviction is signalled")
        .unwrap();
}
