//! The scheduler's leader lease against a real Valkey (or Redis) at
//! `VALKEY_ADDR` (default 127.0.0.1:6379): one holder at a time, renewal
//! only by the holder, expiry without renewal, hand-over on release. Each
//! test uses a service name of its own and deletes its key at the end.

#![cfg(feature = "worker")]

use std::time::Duration;

use super::support::valkey_addr;
use crate::queue::Client;
use crate::scheduler::lease::{self, Acquired, Lease};

/// Two handles on the lease of a service of the test's own, as two
/// replicas have.
async fn two_replicas(ttl: Duration) -> (Lease, Lease, String) {
    let client = Client::connect(&valkey_addr(), None, 0)
        .await
        .expect("these tests need Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
    let service = format!("test_{}", uuid::Uuid::now_v7().simple());
    (
        Lease::new(client.connection(), &service, ttl),
        Lease::new(client.connection(), &service, ttl),
        service,
    )
}

async fn delete_key(service: &str) {
    let mut conn = redis::Client::open(format!("redis://{}/", valkey_addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("DEL")
        .arg(lease::key(service))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn one_replica_leads_at_a_time_and_only_it_renews() {
    let ttl = Duration::from_secs(10);
    let (first, second, service) = two_replicas(ttl).await;

    assert_eq!(first.acquire().await.unwrap(), Acquired::Leading);
    let Acquired::HeldFor(left) = second.acquire().await.unwrap() else {
        panic!("two replicas lead at once");
    };
    assert!(left <= ttl && left > Duration::ZERO, "{left:?}");
    assert!(first.renew().await.unwrap());
    assert!(!second.renew().await.unwrap(), "a follower renewed");

    // Releasing hands over at once; a follower's release changes nothing.
    second.release().await.unwrap();
    assert!(matches!(
        second.acquire().await.unwrap(),
        Acquired::HeldFor(_)
    ));
    first.release().await.unwrap();
    assert_eq!(second.acquire().await.unwrap(), Acquired::Leading);
    assert!(
        !first.renew().await.unwrap(),
        "a released lease was renewed"
    );
    delete_key(&service).await;
}

#[tokio::test]
async fn a_lease_not_renewed_runs_out_and_another_replica_takes_it() {
    let ttl = Duration::from_millis(300);
    let (first, second, service) = two_replicas(ttl).await;

    assert_eq!(first.acquire().await.unwrap(), Acquired::Leading);
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert_eq!(second.acquire().await.unwrap(), Acquired::Leading);
    assert!(!first.renew().await.unwrap(), "the old leader renewed");
    delete_key(&service).await;
}
