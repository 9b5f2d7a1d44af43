//! Whether a shared cache holds its first full list, for any number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` (5.0) wakes only one of several tasks or futures
//! that wait on the same store at once: its readiness is one oneshot receiver behind a mutex,
//! and each poll of a waiter replaces the single waker registered in it, so only the last
//! waiter to poll is woken when the list is in. The operator waits on its shared caches from its
//! start-up (the ready flag behind `/readyz`) and from reconciles: a reconcile that lost waited
//! until [`super::RECONCILE_TIMEOUT`] abandoned it, and a start-up that lost never set the ready
//! flag (`apiserver_restart`: "caches not ready after 180 s", the pods cache filled, the presets
//! cache never reported). Here the reflected watch sets a `tokio::sync::watch` flag when its
//! first list has been swapped into the store, and every waiter is woken.

use futures::{Stream, TryStreamExt};
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

/// Waits for a cache's first full list (cheap to clone; any number may wait at once).
#[derive(Clone, Debug)]
pub struct Filled {
    rx: watch::Receiver<bool>,
}

/// Marks one cache filled (held by the watch that fills it).
#[derive(Debug)]
pub struct MarkFilled {
    tx: watch::Sender<bool>,
}

/// A flag not yet set and the handle that sets it.
pub fn filled() -> (MarkFilled, Filled) {
    let (tx, rx) = watch::channel(false);
    (MarkFilled { tx }, Filled { rx })
}

impl MarkFilled {
    /// The cache holds a full list: wake every waiter (and let later ones pass at once).
    pub fn mark(&self) {
        self.tx.send_replace(true);
    }
}

impl Filled {
    /// Returns `true` once the cache holds its first full list, or `false` if the watch that
    /// fills it ended before that (the controllers are stopping).
    pub async fn wait(&self) -> bool {
        let mut rx = self.rx.clone();
        let filled = rx.wait_for(|filled| *filled).await.is_ok();
        filled
    }

    /// Whether the cache holds its first full list now.
    pub fn is_filled(&self) -> bool {
        *self.rx.borrow()
    }
}

/// Passes `events` through unchanged and marks the cache filled at each `InitDone`. `events`
/// must already be reflected into the cache (`.reflect(writer)`): the reflector swaps the list
/// into the store before it hands `InitDone` on, so a woken waiter finds the list in the store.
pub fn mark_filled<K, S>(
    events: S,
    mark: MarkFilled,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Send,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send,
{
    events.inspect_ok(move |ev| {
        if matches!(ev, Event::InitDone) {
            mark.mark();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc::unbounded;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::WatchStreamExt;
    use std::time::Duration;

    /// How long a woken waiter may take to finish (it is woken at once; this only bounds a
    /// failure, on a busy machine).
    const WOKEN_WITHIN: Duration = Duration::from_secs(30);

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Waiters that started waiting one after the other, in different tasks (the operator's
    /// start-up and a reconcile), are all woken when the list is in, and each finds it in the
    /// store. (The same test on `Store::wait_until_ready` of kube-runtime 5.0 leaves the first
    /// waiter pending for ever: only the last one to poll is woken.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_waiter_is_woken_and_finds_the_list_in_the_store() {
        let (store, writer) = reflector::store::<Pod>();
        let (mark, filled) = filled();
        let (tx, rx) = unbounded::<Result<Event<Pod>, watcher::Error>>();
        let driver = tokio::spawn(mark_filled(rx.reflect(writer), mark).for_each(|_| async {}));

        let mut waiters = Vec::new();
        for _ in 0..3 {
            let (filled, store) = (filled.clone(), store.clone());
            let (started_tx, started_rx) = tokio::sync::oneshot::channel();
            waiters.push(tokio::spawn(async move {
                let wait = filled.wait();
                futures::pin_mut!(wait);
                // Poll once (registering this task's waker) before the next waiter starts.
                assert!(futures::poll!(wait.as_mut()).is_pending());
                let _ = started_tx.send(());
                let ok = wait.await;
                (ok, store.get(&ObjectRef::new("a").within("ns")).is_some())
            }));
            started_rx.await.expect("the waiter started waiting");
        }
        assert!(!filled.is_filled());

        tx.unbounded_send(Ok(Event::Init)).unwrap();
        tx.unbounded_send(Ok(Event::InitApply(pod("a")))).unwrap();
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        for (i, w) in waiters.into_iter().enumerate() {
            let got = tokio::time::timeout(WOKEN_WITHIN, w)
                .await
                .unwrap_or_else(|_| panic!("waiter {i} was never woken"))
                .expect("waiter task");
            assert_eq!(
                got,
                (true, true),
                "waiter {i}: (woken as filled, list in store)"
            );
        }
        assert!(filled.is_filled());
        // A later waiter passes at once.
        assert!(filled.wait().await);
        drop(tx);
        driver.await.unwrap();
    }

    /// A watch that ends before its first list (the controllers stop) releases its waiters with
    /// `false` instead of leaving them pending.
    #[tokio::test]
    async fn waiters_are_released_when_the_watch_ends_unfilled() {
        let (_, writer) = reflector::store::<Pod>();
        let (mark, filled) = filled();
        let (tx, rx) = unbounded::<Result<Event<Pod>, watcher::Error>>();
        let waiter = tokio::spawn({
            let filled = filled.clone();
            async move { filled.wait().await }
        });
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        drop(tx);
        mark_filled(rx.reflect(writer), mark)
            .for_each(|_| async {})
            .await;
        let got = tokio::time::timeout(WOKEN_WITHIN, waiter)
            .await
            .expect("the waiter was released")
            .unwrap();
        assert!(!got);
        assert!(!filled.is_filled());
    }
}
