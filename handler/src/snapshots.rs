//! Garbage collection of VM pool snapshots on this node.
//!
//! Snapshots live in `<root>/<pool uid>/<snapshot id>/` (`/var/lib/microvirt/snapshots` by
//! default, a hostPath that builder pods write and warm pods restore from). A directory is
//! removed when its pool no longer exists, or when it is neither the pool's current snapshot
//! (`status.snapshot.id`) nor used by a launcher pod on this node that is not finished
//! (annotation `microvirt.io/pool-uid` and label `microvirt.io/snapshot`). A running VM keeps
//! working when its snapshot's files are removed (its memory mapping holds the file), so only a
//! restore still to come needs the directory, and those come from pods that exist.
//!
//! The sweep runs when a pool is deleted or changes, and every `interval`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use microvirt_crds::pool::{ANNOTATION_POOL_UID, LABEL_SNAPSHOT};
use microvirt_crds::VirtualMachinePool;

use crate::agent::LAUNCHER_SELECTOR;
use crate::shutdown::Shutdown;

/// Where the collector looks and how often.
#[derive(Clone, Debug)]
pub struct GcConfig {
    /// The snapshot root as this process sees it.
    pub root: PathBuf,
    /// This node (pods that use snapshots are looked up here).
    pub node_name: String,
    /// Sweep at least this often.
    pub interval: Duration,
}

/// A snapshot directory: (pool uid, snapshot id).
pub type SnapshotDir = (String, String);

/// Whether a name can be a directory we made (uids and ids: letters, digits, `-`).
fn plausible(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The snapshot directories under `root` (entries that are not plain directories with
/// plausible names are ignored, never removed).
pub fn list_dirs(root: &Path) -> std::io::Result<Vec<SnapshotDir>> {
    let mut out = Vec::new();
    let top = match std::fs::read_dir(root) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for pool in top {
        let pool = pool?;
        let Some(uid) = pool.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !plausible(&uid) || !pool.file_type()?.is_dir() {
            continue;
        }
        for snap in std::fs::read_dir(pool.path())? {
            let snap = snap?;
            let Some(id) = snap.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if plausible(&id) && snap.file_type()?.is_dir() {
                out.push((uid.clone(), id));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Which directories to remove: `pools` maps each existing pool's uid to its current snapshot
/// id; `in_use` holds what unfinished launcher pods on this node use.
pub fn unused(
    dirs: &[SnapshotDir],
    pools: &HashMap<String, Option<String>>,
    in_use: &BTreeSet<SnapshotDir>,
) -> Vec<SnapshotDir> {
    dirs.iter()
        .filter(|d| !in_use.contains(*d))
        .filter(|(uid, id)| match pools.get(uid) {
            None => true,
            Some(current) => current.as_deref() != Some(id.as_str()),
        })
        .cloned()
        .collect()
}

/// Snapshots used by unfinished launcher pods (from their annotation and label).
pub fn used_by(pods: &[Pod]) -> BTreeSet<SnapshotDir> {
    pods.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|p| {
            Some((
                p.annotations().get(ANNOTATION_POOL_UID)?.clone(),
                p.labels().get(LABEL_SNAPSHOT)?.clone(),
            ))
        })
        .collect()
}

/// One sweep; returns what was removed.
pub async fn sweep(
    client: &Client,
    cfg: &GcConfig,
    pools: &HashMap<String, Option<String>>,
) -> Result<Vec<SnapshotDir>, String> {
    let dirs = list_dirs(&cfg.root).map_err(|e| format!("{}: {e}", cfg.root.display()))?;
    if dirs.is_empty() {
        return Ok(vec![]);
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default()
        .fields(&format!("spec.nodeName={}", cfg.node_name))
        .labels(LAUNCHER_SELECTOR);
    let pods = pods
        .list(&lp)
        .await
        .map_err(|e| format!("listing launcher pods: {e}"))?;
    let gone = unused(&dirs, pools, &used_by(&pods.items));
    let mut removed = Vec::new();
    for (uid, id) in gone {
        let d = cfg.root.join(&uid).join(&id);
        match std::fs::remove_dir_all(&d) {
            Ok(()) => {
                tracing::info!("removed snapshot {id} of pool {uid} ({})", d.display());
                removed.push((uid.clone(), id));
            }
            Err(e) => tracing::warn!("removing {}: {e}", d.display()),
        }
        // The pool's directory goes with its last snapshot.
        let _ = std::fs::remove_dir(cfg.root.join(&uid));
    }
    Ok(removed)
}

/// Watches pools and sweeps until `shutdown`.
pub async fn run(client: Client, cfg: GcConfig, shutdown: Shutdown) {
    let api: Api<VirtualMachinePool> = Api::all(client.clone());
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut pools: HashMap<String, Option<String>> = HashMap::new();
    let mut listing: Option<HashMap<String, Option<String>>> = None;
    let mut synced = false;
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let current = |p: &VirtualMachinePool| {
        p.status
            .as_ref()
            .and_then(|s| s.snapshot.as_ref())
            .map(|s| s.id.clone())
    };
    tracing::info!("snapshot collector watching {}", cfg.root.display());
    loop {
        let due = tokio::select! {
            ev = events.next() => match ev {
                None => return,
                Some(Ok(Event::Init)) => { listing = Some(HashMap::new()); false }
                Some(Ok(Event::InitApply(p))) => {
                    if let (Some(l), Some(uid)) = (listing.as_mut(), p.uid()) {
                        l.insert(uid, current(&p));
                    }
                    false
                }
                Some(Ok(Event::InitDone)) => {
                    if let Some(l) = listing.take() {
                        pools = l;
                    }
                    synced = true;
                    true
                }
                Some(Ok(Event::Apply(p))) => p.uid().is_some_and(|uid| {
                    let c = current(&p);
                    pools.insert(uid, c.clone()) != Some(c)
                }),
                Some(Ok(Event::Delete(p))) => {
                    if let Some(uid) = p.uid() {
                        pools.remove(&uid);
                    }
                    true
                }
                Some(Err(e)) => {
                    tracing::warn!("watching VM pools: {e}");
                    false
                }
            },
            _ = tick.tick() => true,
            _ = shutdown.wait() => return,
        };
        if due && synced {
            if let Err(e) = sweep(&client, &cfg, &pools).await {
                tracing::warn!("snapshot collection: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn d(uid: &str, id: &str) -> SnapshotDir {
        (uid.into(), id.into())
    }

    #[test]
    fn what_is_unused() {
        let dirs = vec![
            d("p1", "a-1"),
            d("p1", "a-2"),
            d("p1", "b-1"),
            d("p2", "c-1"),
            d("gone", "x-1"),
            d("gone", "x-2"),
        ];
        let pools = HashMap::from([
            ("p1".to_string(), Some("a-2".to_string())),
            ("p2".to_string(), None),
        ]);
        let in_use = BTreeSet::from([d("p1", "a-1"), d("gone", "x-2")]);
        assert_eq!(
            unused(&dirs, &pools, &in_use),
            vec![d("p1", "b-1"), d("p2", "c-1"), d("gone", "x-1")]
        );
    }

    #[test]
    fn finished_pods_use_nothing() {
        let pod = |phase: &str, uid: Option<&str>| {
            let mut p = Pod::default();
            p.metadata.labels = Some(BTreeMap::from([(
                LABEL_SNAPSHOT.to_string(),
                "a-1".to_string(),
            )]));
            p.metadata.annotations =
                uid.map(|u| BTreeMap::from([(ANNOTATION_POOL_UID.to_string(), u.to_string())]));
            p.status = Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            p
        };
        let used = used_by(&[
            pod("Running", Some("p1")),
            pod("Failed", Some("p2")),
            pod("Pending", None),
        ]);
        assert_eq!(used, BTreeSet::from([d("p1", "a-1")]));
    }

    #[test]
    fn only_plausible_directories_are_listed() {
        let root = std::env::temp_dir().join(format!("mvh-gc-list-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("p1/a-1")).unwrap();
        std::fs::create_dir_all(root.join("p1/.partial")).unwrap();
        std::fs::create_dir_all(root.join("bad name/a-1")).unwrap();
        std::fs::write(root.join("p1/file"), b"x").unwrap();
        std::fs::write(root.join("top-file"), b"x").unwrap();
        std::os::unix::fs::symlink("/", root.join("p1/link")).unwrap();
        let dirs = list_dirs(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(dirs, vec![d("p1", "a-1")]);
        assert!(
            list_dirs(&root).unwrap().is_empty(),
            "a missing root is empty"
        );
    }
}
