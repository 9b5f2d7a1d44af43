//! VirtualMachinePool: replicas claimed from warm members.
//!
//! A warm member is a launcher pod that restored a snapshot of the pool's booted template and
//! waits paused (its guest memory is mapped from the snapshot's file, so an idle member costs
//! its launcher, not its RAM). Scaling up claims one: the pool controller creates the replica's
//! VMI under the member's name (`virt-launcher-<vmi>` is the member's pod), hands the pod to the
//! VMI (labels, owner, uid) and writes the control request that the node agent carries out by
//! resuming the launcher; the VMI is Ready once the agent confirms. No pod is created and no
//! kubelet sync or probe period is waited for. The pool then refills in the background.
//!
//! - [`members`]: the effective template, its hash, builder and warm pods, replica VMIs, the
//!   claim patch;
//! - [`snapshot`]: the snapshot's lifecycle (capture on a builder, compatibility, failures);
//! - [`plan`]: one reconcile's decisions (pure);
//! - [`expectations`]: writes the caches have not shown yet;
//! - [`latency`]: claim latency for `status.claimLatency`.
//!
//! The reconciler that makes the API calls is [`reconcile`]; user documentation is
//! `docs/pools.md`.

use std::collections::HashMap;
use std::sync::Mutex;

pub mod expectations;
pub mod latency;
pub mod members;
pub mod plan;
pub mod reconcile;
pub mod snapshot;

pub use expectations::PoolExpectations;
pub use latency::LatencyTracker;

/// In-memory state of the pool controller, shared with the VMI controller (claim latency).
#[derive(Debug, Default)]
pub struct PoolState {
    /// Unconfirmed writes per pool uid.
    pub expectations: Mutex<HashMap<String, PoolExpectations>>,
    /// The last failed create per pool uid (reported as `ReplicaFailure`).
    pub failures: Mutex<HashMap<String, String>>,
    /// Claim latency.
    pub latency: LatencyTracker,
}
