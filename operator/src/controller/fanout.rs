//! One reflected watch feeding several controllers.
//!
//! A controller triggered by one watch that reads its objects from a cache filled by another
//! watch can run on a cache older than its trigger, and nothing triggers it again once the
//! cache catches up: the VM pool controller, woken by its second warm member turning Ready,
//! read the pods' cache before that change reached it, reported one warm member, and kept
//! saying so until its next timed requeue (the real-node test waited 240 s for it). Here each
//! kind is watched once, the watch fills the shared cache, and only then is every object it
//! touched (applied, deleted, listed) handed to each controller that depends on that kind.

use std::future::Future;

use futures::channel::mpsc::{unbounded, UnboundedReceiver};
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

/// What a controller gets: each object the shared watch touched, after the cache has it.
pub type Trigger<K> = UnboundedReceiver<Result<K, watcher::Error>>;

/// Splits `events` — a watch already reflected into the shared cache (`.reflect(writer)`) —
/// into `n` trigger streams. The returned future drives the watch and must be polled for as
/// long as the controllers run. Watch errors (the watch retries with its own back-off) are
/// logged here rather than handed on: they carry no object to reconcile.
pub fn fan_out<K, S>(
    events: S,
    n: usize,
    what: &'static str,
) -> (impl Future<Output = ()> + Send, Vec<Trigger<K>>)
where
    K: Clone + Send + Sync + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| unbounded()).unzip();
    let driver = async move {
        let mut events = Box::pin(events);
        while let Some(ev) = events.next().await {
            match ev {
                Ok(Event::Apply(o) | Event::Delete(o) | Event::InitApply(o)) => {
                    for tx in &txs {
                        // A controller that stopped (shutdown) no longer listens.
                        let _ = tx.unbounded_send(Ok(o.clone()));
                    }
                }
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => tracing::warn!("watching {what}: {e}"),
            }
        }
    };
    (driver, rxs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::WatchStreamExt;

    fn pod(name: &str, rv: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn every_consumer_gets_every_touched_object_after_the_cache_has_it() {
        let (store, writer) = reflector::store::<Pod>();
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a", "1"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(pod("a", "2"))),
            Ok(Event::Apply(pod("b", "3"))),
            Ok(Event::Delete(pod("a", "4"))),
        ]);
        let (driver, rxs) = fan_out(events.reflect(writer), 3, "pods");
        driver.await;
        for rx in rxs {
            let seen: Vec<(String, String)> = rx
                .map(|r| {
                    let p = r.expect("no errors");
                    (
                        p.metadata.name.unwrap(),
                        p.metadata.resource_version.unwrap(),
                    )
                })
                .collect()
                .await;
            assert_eq!(
                seen,
                [("a", "1"), ("a", "2"), ("b", "3"), ("a", "4")]
                    .map(|(n, rv)| (n.to_string(), rv.to_string()))
            );
        }
        // The cache was updated before the objects were handed on: it holds the end state.
        assert!(store.get(&ObjectRef::new("a").within("ns")).is_none());
        assert_eq!(
            store
                .get(&ObjectRef::new("b").within("ns"))
                .and_then(|p| p.metadata.resource_version.clone())
                .as_deref(),
            Some("3")
        );
    }

    #[tokio::test]
    async fn a_consumer_sees_the_cache_at_least_as_new_as_its_trigger() {
        let (store, writer) = reflector::store::<Pod>();
        let (tx, rx) = unbounded::<Result<Event<Pod>, watcher::Error>>();
        let (driver, mut triggers) = fan_out(rx.reflect(writer), 1, "pods");
        let driver = tokio::spawn(driver);
        let mut trigger = triggers.remove(0);
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        for rv in 1..=50 {
            tx.unbounded_send(Ok(Event::Apply(pod("a", &rv.to_string()))))
                .unwrap();
            let got = trigger.next().await.unwrap().unwrap();
            let cached = store.get(&ObjectRef::new("a").within("ns")).unwrap();
            let v = |p: &Pod| -> u32 {
                p.metadata
                    .resource_version
                    .as_deref()
                    .unwrap()
                    .parse()
                    .unwrap()
            };
            assert!(
                v(&cached) >= v(&got),
                "cache {} behind trigger {}",
                v(&cached),
                v(&got)
            );
        }
        drop(tx);
        driver.await.unwrap();
    }
}
