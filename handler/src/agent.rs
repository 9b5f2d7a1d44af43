//! The node agent: one task per launcher pod on this node.
//!
//! The agent watches the pods of its node (field selector `spec.nodeName=<node>`, label
//! `app.kubernetes.io/name=virt-launcher`). For each pod that is not finished it keeps a
//! `watch` connection to the launcher's control socket, found through the kubelet's pod volume
//! directory (`<kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/runtime/control.sock`),
//! and
//! - reports the VMI condition `Paused` (True while the launcher's state is `paused`) with a
//!   server-side apply of the VMI status under field manager [`FIELD_MANAGER`], with the
//!   VMI's uid as precondition; it owns only that list entry (`status.conditions` is a map
//!   list keyed by `type`), the operator owns the rest;
//! - sets the launcher pod's readiness gate, the pod condition `microvirt.io/vm-running`
//!   (strategic merge patch on `pods/status`): `True` while the launcher's VM runs (and while a
//!   VM pool's unclaimed warm member waits paused, restored), `False` when it is paused,
//!   starting or stopped; absent until the agent has reached the launcher. The kubelet's pod
//!   Ready follows it, and the operator's VMI Ready follows the pod (KubeVirt's Ready, without
//!   probes: nothing runs while the VM idles);
//! - sets the informational pod condition `microvirt.io/guest-booted` and the pod annotation
//!   `microvirt.io/boot-time-ms` once the guest signalled boot through the boot timer;
//! - carries out control requests that the operator writes on the pod (annotation
//!   `microvirt.io/control-request: <id> pause|unpause|snapshot`) once per id and answers with
//!   `microvirt.io/control-result: <id> ok|error <message>` (the grammar:
//!   [`microvirt_crds::control`]) — the path a warm-pool claim uses to resume a paused
//!   launcher without creating a pod, and the one a pool's builder is snapshotted through
//!   (`snapshot`: the launcher writes into its pod's snapshot mount,
//!   `/var/run/microvirt/snapshot`; the answer is `<id> ok <host facts>`), see
//!   docs/node-agent.md and docs/pools.md;
//! - follows a pool's warm member when it is claimed: from then on the pod names a VMI (label
//!   `microvirt.io/vmi`, annotation `microvirt.io/vmi-uid`) and `Paused` is reported for it.
//!
//! The launcher itself never gets API credentials: everything it knows goes through this
//! agent or through its pod's status.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use microvirt_crds::control::{self, ControlCommand, ControlRequest, ControlResult, ParseError};
use microvirt_crds::launcher_state::LauncherState;
use microvirt_crds::pool::LABEL_POOL_ROLE;
use microvirt_crds::vmi::{
    VirtualMachineInstance, VmiCondition, ANNOTATION_BOOT_TIME_MS, ANNOTATION_CONTROL_REQUEST,
    ANNOTATION_CONTROL_RESULT, ANNOTATION_VMI_UID, CONDITION_PAUSED, LABEL_VMI_NAME,
    POD_CONDITION_GUEST_BOOTED, POD_CONDITION_VM_RUNNING, REASON_GUEST_BOOTED, REASON_VM_PAUSED,
    REASON_VM_RUNNING, REASON_VM_STARTING, REASON_VM_STOPPED, REASON_WARM_MEMBER,
};
use serde_json::json;
use tokio::sync::watch;

use crate::launcher::{self, LauncherStatus, StatusWatch};
use crate::shutdown::Shutdown;

/// Field manager of every write the agent makes.
pub const FIELD_MANAGER: &str = "virt-handler";
/// Label selector of launcher pods.
pub const LAUNCHER_SELECTOR: &str = "app.kubernetes.io/name=virt-launcher";
/// Name of the launcher pod's scratch emptyDir (docs/launcher-pod.md).
pub const RUNTIME_VOLUME: &str = "runtime";
/// The control socket's name inside it.
pub const CONTROL_SOCKET: &str = "control.sock";
/// Reasons of the Paused condition.
pub const REASON_PAUSED: &str = "PausedByUser";
pub const REASON_NOT_PAUSED: &str = "NotPaused";
/// Longest delay between retries of a failed API write.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often the agent looks for the control socket of a launcher whose container runs, and
/// for how many tries (5 s) before it falls back to [`AgentConfig::retry`].
const FAST_CONNECT: Duration = Duration::from_millis(20);
const FAST_CONNECT_TRIES: u32 = 250;
/// How long a launcher may take to write a snapshot.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Where the agent looks.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This node's name (pods are selected by `spec.nodeName`).
    pub node_name: String,
    /// The kubelet's root directory as mounted into the agent (pods are under `pods/`).
    pub kubelet_root: PathBuf,
    /// Name of the launcher pod's runtime emptyDir.
    pub runtime_volume: String,
    /// File name of the control socket in it.
    pub control_socket: String,
    /// Watch only this namespace (default: all).
    pub namespace: Option<String>,
    /// How long to wait before connecting again to a launcher, and before retrying a failed
    /// API write; also the poll period for launchers without `watch`.
    pub retry: Duration,
    /// This host's facts (`microvirt.io/host-facts`), reported with every snapshot taken here.
    pub host_facts: Option<String>,
}

impl AgentConfig {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            kubelet_root: "/var/lib/kubelet".into(),
            runtime_volume: RUNTIME_VOLUME.into(),
            control_socket: CONTROL_SOCKET.into(),
            namespace: None,
            retry: Duration::from_millis(200),
            host_facts: None,
        }
    }
}

/// The error message the agent answers an unreadable control request `raw` with.
fn refusal(raw: &str, err: &ParseError) -> String {
    let names = ControlCommand::ALL.map(ControlCommand::as_str);
    match err {
        ParseError::UnknownCommand(c) => {
            let mut list = String::new();
            for (i, name) in names.iter().enumerate() {
                if i > 0 {
                    list.push_str(if i + 1 == names.len() { " or " } else { ", " });
                }
                list.push_str(name);
            }
            format!("unknown command {c:?} (want {list})")
        }
        _ => format!(
            "malformed request {raw:?} (want \"<id> {}\")",
            names.join("|")
        ),
    }
}

/// Whether a container of the pod runs.
fn container_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// Whether a pod is finished (its launcher is gone for good).
fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

struct Tracked {
    pod: watch::Sender<Pod>,
    task: tokio::task::JoinHandle<()>,
}

/// Runs the agent until `shutdown`.
pub async fn run(client: Client, cfg: AgentConfig, shutdown: Shutdown) -> Result<(), AgentError> {
    if cfg.node_name.is_empty() {
        return Err(AgentError::Config(
            "the node name is empty (--node-name or NODE_NAME)".into(),
        ));
    }
    let pods: Api<Pod> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let wc = watcher::Config::default()
        .fields(&format!("spec.nodeName={}", cfg.node_name))
        .labels(LAUNCHER_SELECTOR);
    let mut events = watcher::watcher(pods, wc).default_backoff().boxed();
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    let mut listing: Option<HashSet<String>> = None;
    tracing::info!(
        "node agent watching launcher pods on node {} (kubelet root {})",
        cfg.node_name,
        cfg.kubelet_root.display()
    );
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            _ = shutdown.wait() => break,
        };
        let Some(ev) = ev else { break };
        match ev {
            Ok(Event::Init) => listing = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(seen), Some(uid)) = (listing.as_mut(), pod.uid()) {
                    seen.insert(uid);
                }
                upsert(&client, &cfg, &shutdown, &mut tracked, pod);
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = listing.take() {
                    tracked.retain(|uid, t| {
                        let keep = seen.contains(uid);
                        if !keep {
                            t.task.abort();
                        }
                        keep
                    });
                }
            }
            Ok(Event::Apply(pod)) => upsert(&client, &cfg, &shutdown, &mut tracked, pod),
            Ok(Event::Delete(pod)) => {
                if let Some(t) = pod.uid().and_then(|u| tracked.remove(&u)) {
                    t.task.abort();
                }
            }
            Err(e) => tracing::warn!("watching launcher pods: {e}"),
        }
        tracked.retain(|_, t| !t.task.is_finished());
    }
    for (_, t) in tracked.drain() {
        t.task.abort();
    }
    tracing::info!("node agent stopped");
    Ok(())
}

fn upsert(
    client: &Client,
    cfg: &AgentConfig,
    shutdown: &Shutdown,
    tracked: &mut HashMap<String, Tracked>,
    pod: Pod,
) {
    let Some(uid) = pod.uid() else { return };
    if finished(&pod) {
        if let Some(t) = tracked.remove(&uid) {
            t.task.abort();
        }
        return;
    }
    if let Some(t) = tracked.get(&uid) {
        t.pod.send_replace(pod);
        return;
    }
    let (tx, rx) = watch::channel(pod);
    let task = tokio::spawn(launcher_task(
        client.clone(),
        cfg.clone(),
        rx,
        shutdown.clone(),
    ));
    tracked.insert(uid, Tracked { pod: tx, task });
}

/// What one launcher task knows about its VMI.
struct VmiRef {
    api: Api<VirtualMachineInstance>,
    name: String,
    uid: Option<String>,
}

/// Follows one launcher pod: status watch, Paused condition, boot time, control requests.
async fn launcher_task(
    client: Client,
    cfg: AgentConfig,
    mut pod_rx: watch::Receiver<Pod>,
    shutdown: Shutdown,
) {
    let pod = pod_rx.borrow_and_update().clone();
    let (Some(uid), Some(ns)) = (pod.uid(), pod.namespace()) else {
        return;
    };
    let pod_name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let vmi = pod.labels().get(LABEL_VMI_NAME).map(|name| VmiRef {
        api: Api::namespaced(client.clone(), &ns),
        name: name.clone(),
        uid: pod.annotations().get(ANNOTATION_VMI_UID).cloned(),
    });
    let socket = launcher::control_socket_path(
        &cfg.kubelet_root,
        &uid,
        &cfg.runtime_volume,
        &cfg.control_socket,
    );
    let (gate_written, booted_written) = written_conditions(&pod);
    let mut st = TaskState {
        client: client.clone(),
        host_facts: cfg.host_facts.clone(),
        pods,
        pod_name: pod_name.clone(),
        pod_uid: uid.clone(),
        warm: is_warm(&pod),
        state: None,
        booted: false,
        gate_written,
        booted_written,
        vmi,
        socket: socket.clone(),
        vmi_read: false,
        reported: None,
        want_paused: None,
        boot_ms_written: pod
            .annotations()
            .get(ANNOTATION_BOOT_TIME_MS)
            .and_then(|v| v.parse().ok()),
        handled: pod
            .annotations()
            .get(ANNOTATION_CONTROL_RESULT)
            .and_then(|r| control::id_of(r))
            .map(str::to_string),
        want_boot_ms: None,
    };
    let mut logged_wait = false;
    let mut fast_left = FAST_CONNECT_TRIES;
    'connect: loop {
        if shutdown.is_set() {
            return;
        }
        let mut w = match StatusWatch::open(&socket, cfg.retry).await {
            Ok(w) => w,
            Err(e) => {
                if !logged_wait {
                    tracing::debug!("{ns}/{pod_name}: waiting for the launcher: {e}");
                    logged_wait = true;
                }
                // The container runs: its launcher serves the socket within moments, and
                // the pod's readiness waits for this connection. Look again soon (for a
                // bounded while), else at the normal pace.
                let delay = if fast_left > 0 && container_running(&pod_rx.borrow()) {
                    fast_left -= 1;
                    FAST_CONNECT.min(cfg.retry)
                } else {
                    cfg.retry
                };
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait() => return,
                    r = pod_rx.changed() => if r.is_err() { return },
                }
                continue 'connect;
            }
        };
        tracing::info!("{ns}/{pod_name}: connected to {}", w.path().display());
        logged_wait = false;
        let pod = pod_rx.borrow_and_update().clone();
        st.control(&pod).await;
        // Failed API writes are retried with a doubling delay (cfg.retry up to MAX_BACKOFF).
        let mut backoff = cfg.retry;
        loop {
            let retry = st.pending();
            if !retry {
                backoff = cfg.retry;
            }
            tokio::select! {
                s = w.next() => match s {
                    Ok(s) => st.observe(&s),
                    Err(e) => {
                        tracing::info!("{ns}/{pod_name}: launcher connection ended: {e}");
                        if !st.socket.exists() {
                            // The launcher removes its socket when it exits: not paused any
                            // more, and its VM does not run.
                            st.want_paused = Some(false);
                            st.state = Some(LauncherState::Stopped);
                            st.flush().await;
                        }
                        continue 'connect;
                    }
                },
                r = pod_rx.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let pod = pod_rx.borrow_and_update().clone();
                    st.control(&pod).await;
                }
                _ = tokio::time::sleep(backoff), if retry => {
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                _ = shutdown.wait() => return,
            }
            st.flush().await;
        }
    }
}

struct TaskState {
    client: Client,
    host_facts: Option<String>,
    pods: Api<Pod>,
    pod_name: String,
    /// The pod's uid (a precondition of every status patch).
    pod_uid: String,
    /// The pod is a VM pool's unclaimed warm member (label `microvirt.io/pool-role=warm`).
    warm: bool,
    /// The launcher's state as last seen (None: not reached yet).
    state: Option<LauncherState>,
    /// The launcher says the guest booted.
    booted: bool,
    /// The readiness gate as last read from the pod or written: status, reason and when its
    /// status last changed.
    gate_written: Option<Gate>,
    /// The pod has `microvirt.io/guest-booted=True`.
    booted_written: bool,
    vmi: Option<VmiRef>,
    socket: PathBuf,
    /// Whether `reported` was read from the VMI.
    vmi_read: bool,
    /// The VMI's Paused condition as last read or written (None: it has none).
    reported: Option<bool>,
    /// What the launcher says.
    want_paused: Option<bool>,
    boot_ms_written: Option<u64>,
    want_boot_ms: Option<u64>,
    /// The id of the last control request carried out.
    handled: Option<String>,
}

impl TaskState {
    fn observe(&mut self, s: &LauncherStatus) {
        tracing::debug!("{}: launcher state {}", self.pod_name, s.state);
        self.want_paused = Some(s.paused());
        self.state = Some(s.state.clone());
        if s.booted {
            self.booted = true;
            self.want_boot_ms = s.boot_time_ms;
        }
    }

    /// The readiness gate the launcher's state asks for (None before the launcher was reached).
    fn want_gate(&self) -> Option<(bool, &'static str)> {
        Some(gate_for(self.state.as_ref()?, self.warm))
    }

    /// Whether a write is still to be done (and so retried).
    fn pending(&self) -> bool {
        let paused = self.want_paused.is_some() && self.want_paused != self.reported;
        let boot = self.want_boot_ms.is_some() && self.want_boot_ms != self.boot_ms_written;
        paused || boot || self.pod_conditions_pending()
    }

    fn pod_conditions_pending(&self) -> bool {
        let gate = self.want_gate().is_some_and(|(status, reason)| {
            self.gate_written
                .as_ref()
                .is_none_or(|g| g.status != status || g.reason != reason)
        });
        gate || (self.booted && !self.booted_written)
    }

    /// Writes the readiness gate and the guest-booted condition where they differ from what the
    /// pod has: one strategic merge patch of `pods/status` (`conditions` merge by `type`, so the
    /// kubelet's conditions stay), with the pod's uid as precondition.
    async fn flush_pod_conditions(&mut self) {
        if !self.pod_conditions_pending() {
            return;
        }
        let now = Time(Timestamp::now());
        let mut conditions = Vec::new();
        let mut gate = None;
        if let Some((status, reason)) = self.want_gate() {
            let since = match &self.gate_written {
                Some(g) if g.status == status => g.since.clone(),
                _ => Some(now.clone()),
            };
            conditions.push(json!({
                "type": POD_CONDITION_VM_RUNNING,
                "status": cap(status),
                "reason": reason,
                "message": gate_message(reason),
                "lastTransitionTime": since,
            }));
            gate = Some(Gate {
                status,
                reason: reason.to_string(),
                since,
            });
        }
        if self.booted && !self.booted_written {
            conditions.push(json!({
                "type": POD_CONDITION_GUEST_BOOTED,
                "status": "True",
                "reason": REASON_GUEST_BOOTED,
                "message": "the guest signalled boot through the boot timer",
                "lastTransitionTime": now,
            }));
        }
        let patch = json!({
            "metadata": {"uid": self.pod_uid},
            "status": {"conditions": conditions},
        });
        match self
            .pods
            .patch_status(&self.pod_name, &merge_params(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                if let Some(g) = gate {
                    tracing::info!(
                        "pod {}: {POD_CONDITION_VM_RUNNING}={} ({})",
                        self.pod_name,
                        cap(g.status),
                        g.reason
                    );
                    self.gate_written = Some(g);
                }
                self.booted_written |= self.booted;
            }
            Err(e) => tracing::warn!("pod {}: writing its conditions: {e}", self.pod_name),
        }
    }

    /// Writes what differs: the pod's conditions (readiness gate first: it is on the path to
    /// Ready), the Paused condition, the boot-time annotation.
    async fn flush(&mut self) {
        self.flush_pod_conditions().await;
        self.flush_paused().await;
        if let Some(ms) = self
            .want_boot_ms
            .filter(|ms| Some(*ms) != self.boot_ms_written)
        {
            let patch =
                json!({"metadata": {"annotations": {ANNOTATION_BOOT_TIME_MS: ms.to_string()}}});
            match self
                .pods
                .patch(&self.pod_name, &merge_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => self.boot_ms_written = Some(ms),
                Err(e) => tracing::warn!("pod {}: boot-time annotation: {e}", self.pod_name),
            }
        }
    }

    /// Follows the VMI the pod names now: a pool's warm member names none until it is
    /// claimed, then the claiming VMI (the claim also asks for the resume).
    fn follow_vmi(&mut self, pod: &Pod) {
        self.warm = is_warm(pod);
        let (Some(name), Some(uid)) = (
            pod.labels().get(LABEL_VMI_NAME),
            pod.annotations().get(ANNOTATION_VMI_UID),
        ) else {
            return;
        };
        if self
            .vmi
            .as_ref()
            .is_some_and(|v| &v.name == name && v.uid.as_ref() == Some(uid))
        {
            return;
        }
        let Some(ns) = pod.namespace() else { return };
        tracing::info!("pod {}: now the launcher of VMI {ns}/{name}", self.pod_name);
        self.vmi = Some(VmiRef {
            api: Api::namespaced(self.client.clone(), &ns),
            name: name.clone(),
            uid: Some(uid.clone()),
        });
        self.vmi_read = false;
        self.reported = None;
    }

    /// Carries out the pod's control request if it is new.
    async fn control(&mut self, pod: &Pod) {
        self.follow_vmi(pod);
        let Some(raw) = pod.annotations().get(ANNOTATION_CONTROL_REQUEST) else {
            return;
        };
        let done = pod
            .annotations()
            .get(ANNOTATION_CONTROL_RESULT)
            .and_then(|r| control::id_of(r));
        // A malformed request is answered too, under its first field.
        let Some(id) = control::id_of(raw).map(str::to_string) else {
            return;
        };
        if done == Some(id.as_str()) || self.handled.as_deref() == Some(&id) {
            return;
        }
        let result = match ControlRequest::parse(raw) {
            Err(e) => ControlResult::error(&id, refusal(raw, &e)),
            Ok(r) if r.command == ControlCommand::Snapshot => {
                // No `dir`: the launcher writes into its pod's snapshot mount
                // (`/var/run/microvirt/snapshot`); the agent never names a path in the pod.
                let req = json!({"cmd": "snapshot"});
                match launcher::request_json(&self.socket, &req, SNAPSHOT_TIMEOUT).await {
                    Ok(answer) => {
                        self.want_paused = Some(true);
                        self.state = Some(LauncherState::Paused);
                        tracing::info!("pod {}: snapshot taken: {answer}", self.pod_name);
                        ControlResult::ok(&id, self.host_facts.clone())
                    }
                    Err(e) => ControlResult::error(&id, e.to_string()),
                }
            }
            Ok(r) => match launcher::request(&self.socket, r.command.as_str()).await {
                Ok(answer) => {
                    if let Ok(s) = LauncherStatus::from_answer(&answer) {
                        self.want_paused = Some(s.paused());
                        self.state = Some(s.state);
                    }
                    ControlResult::ok(&id, None)
                }
                Err(e) => ControlResult::error(&id, e.to_string()),
            },
        }
        .to_string();
        tracing::info!("pod {}: control request: {result}", self.pod_name);
        let patch = json!({"metadata": {"annotations": {ANNOTATION_CONTROL_RESULT: result}}});
        match self
            .pods
            .patch(&self.pod_name, &merge_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => self.handled = Some(id),
            Err(e) => tracing::warn!("pod {}: writing the control result: {e}", self.pod_name),
        }
    }
}

/// The readiness gate as the pod has it (or as the agent wrote it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Gate {
    status: bool,
    reason: String,
    /// Its `lastTransitionTime` (kept while the status stays).
    since: Option<Time>,
}

/// The readiness gate for a launcher in `state`: `True` while the VM runs, and while an
/// unclaimed warm member (`warm`) waits paused after its restore — Ready to be claimed, as the
/// pool counts it; `False` (with why) otherwise. A paused VMI's pod is not Ready (KubeVirt's
/// `kubevirt.io/virtual-machine-unpaused` gate does the same).
pub fn gate_for(state: &LauncherState, warm: bool) -> (bool, &'static str) {
    match state {
        LauncherState::Running => (true, REASON_VM_RUNNING),
        LauncherState::Paused if warm => (true, REASON_WARM_MEMBER),
        LauncherState::Paused => (false, REASON_VM_PAUSED),
        LauncherState::Starting => (false, REASON_VM_STARTING),
        // shutting-down, stopping, stopped, or a state a newer launcher has.
        LauncherState::ShuttingDown
        | LauncherState::Stopping
        | LauncherState::Stopped
        | LauncherState::Other(_) => (false, REASON_VM_STOPPED),
    }
}

fn gate_message(reason: &str) -> &'static str {
    match reason {
        REASON_VM_RUNNING => "the VM is running",
        REASON_WARM_MEMBER => "a warm pool member: restored, paused until it is claimed",
        REASON_VM_PAUSED => "the VM's vCPUs are paused",
        REASON_VM_STARTING => "the VM is starting",
        _ => "the VM is not running",
    }
}

/// Whether the pod is a VM pool's unclaimed warm member.
fn is_warm(pod: &Pod) -> bool {
    pod.labels().get(LABEL_POOL_ROLE).map(String::as_str) == Some("warm")
}

/// The readiness gate and whether `microvirt.io/guest-booted` is True, as the pod has them (a
/// restarted agent writes only what differs).
fn written_conditions(pod: &Pod) -> (Option<Gate>, bool) {
    let conds = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let gate = conds
        .iter()
        .find(|c| c.type_ == POD_CONDITION_VM_RUNNING)
        .map(|c| Gate {
            status: c.status == "True",
            reason: c.reason.clone().unwrap_or_default(),
            since: c.last_transition_time.clone(),
        });
    let booted = conds
        .iter()
        .any(|c| c.type_ == POD_CONDITION_GUEST_BOOTED && c.status == "True");
    (gate, booted)
}

fn cap(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Whether an API error means the VMI is gone.
fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl TaskState {
    /// Stops reporting for this launcher (its VMI is gone or was replaced).
    fn forget_vmi(&mut self, why: &str) {
        if let Some(v) = self.vmi.take() {
            tracing::info!(
                "VMI {}: {why}; no longer reporting for pod {}",
                v.name,
                self.pod_name
            );
        }
    }

    /// Brings the VMI's Paused condition in line with the launcher.
    ///
    /// Server-side apply has no uid precondition (an applied `metadata.uid` is not checked), so
    /// the VMI's uid is compared with the pod's `microvirt.io/vmi-uid` when the condition is
    /// first read and on every object a write returns; a write that landed on a VMI re-created
    /// under the same name (only possible when its finalizer was removed by hand while the old
    /// pod still ran) is withdrawn at once.
    async fn flush_paused(&mut self) {
        let (Some(want), Some(vmi)) = (self.want_paused, self.vmi.as_ref()) else {
            return;
        };
        if !self.vmi_read {
            match vmi.api.get(&vmi.name).await {
                Ok(v) => {
                    if vmi.uid.is_some() && v.uid() != vmi.uid {
                        self.forget_vmi("the VMI has another uid than the pod names");
                        return;
                    }
                    self.reported = v
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_PAUSED))
                        .map(|c| c.status == "True");
                    self.vmi_read = true;
                }
                Err(e) if not_found(&e) => return self.forget_vmi("not found"),
                Err(e) => {
                    tracing::warn!("reading VMI {}: {e}", vmi.name);
                    return;
                }
            }
        }
        if self.reported == Some(want) {
            return;
        }
        let now = Time(Timestamp::now());
        match apply_paused(vmi, Some(want), &now).await {
            Ok(written) if vmi.uid.is_some() && written.uid() != vmi.uid => {
                if let Err(e) = apply_paused(vmi, None, &now).await {
                    tracing::warn!("VMI {}: withdrawing the Paused condition: {e}", vmi.name);
                }
                self.forget_vmi("re-created under the same name");
            }
            Ok(_) => {
                tracing::info!("VMI {}: Paused={}", vmi.name, cap(want));
                self.reported = Some(want);
            }
            Err(e) if not_found(&e) => self.forget_vmi("not found"),
            Err(e) => tracing::warn!("VMI {}: writing Paused={}: {e}", vmi.name, cap(want)),
        }
    }
}

/// Server-side apply of the Paused condition (owned by [`FIELD_MANAGER`]); `None` applies no
/// condition, which removes the entry this manager owns.
async fn apply_paused(
    vmi: &VmiRef,
    paused: Option<bool>,
    now: &Time,
) -> Result<VirtualMachineInstance, kube::Error> {
    let conditions: Vec<VmiCondition> = paused
        .map(|paused| VmiCondition {
            type_: CONDITION_PAUSED.into(),
            status: cap(paused).into(),
            reason: Some(
                if paused {
                    REASON_PAUSED
                } else {
                    REASON_NOT_PAUSED
                }
                .into(),
            ),
            message: paused.then(|| "the VMI's vCPUs are paused".to_string()),
            last_transition_time: Some(now.clone()),
        })
        .into_iter()
        .collect();
    let patch = json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": vmi.name},
        "status": {"conditions": conditions},
    });
    vmi.api
        .patch_status(
            &vmi.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_control_requests_are_refused_with_what_is_wanted() {
        let answer = |raw: &str| {
            let e = ControlRequest::parse(raw).unwrap_err();
            ControlResult::error(control::id_of(raw).unwrap(), refusal(raw, &e)).to_string()
        };
        assert_eq!(
            answer("r2 reboot"),
            "r2 error unknown command \"reboot\" (want pause, unpause or snapshot)"
        );
        assert_eq!(
            answer("r3"),
            "r3 error malformed request \"r3\" (want \"<id> pause|unpause|snapshot\")"
        );
        assert_eq!(
            answer("a b c"),
            "a error malformed request \"a b c\" (want \"<id> pause|unpause|snapshot\")"
        );
    }

    #[test]
    fn the_readiness_gate_follows_the_launchers_state() {
        // As the launcher writes them.
        let gate = |s: &str, warm| gate_for(&LauncherState::parse(s), warm);
        assert_eq!(gate("running", false), (true, "VMRunning"));
        assert_eq!(gate("running", true), (true, "VMRunning"));
        assert_eq!(gate("paused", false), (false, "VMPaused"));
        assert_eq!(gate("paused", true), (true, "RestoredPaused"));
        assert_eq!(gate("starting", false), (false, "VMStarting"));
        for s in ["shutting-down", "stopping", "stopped", "something-new"] {
            assert_eq!(gate(s, false), (false, "VMStopped"), "{s}");
            assert!(!gate(s, true).0, "{s}");
        }
    }
}
