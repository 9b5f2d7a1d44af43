//! The kubelet device plugin for `devices.microvirt.io/kvm` (API v1beta1, like KubeVirt's
//! virt-handler device plugins).
//!
//! Life cycle ([`run`]): bind the plugin socket `<dir>/<endpoint>` and serve the
//! `DevicePlugin` service on it, then call `Registration/Register` on the kubelet's
//! `<dir>/kubelet.sock` (retried until the kubelet answers). Afterwards the directory is
//! polled: when the kubelet restarts it deletes every plugin socket and creates a new
//! `kubelet.sock`; either change makes the plugin stop its server, bind a fresh socket and
//! register again. A separate task polls the device nodes; a change of their presence is
//! sent on every open `ListAndWatch` stream as the whole device list with the new health.
//!
//! The resource is shareable: the plugin advertises `devices` (default 1000) identical
//! devices `kvm-0`, `kvm-1`, …; each one allocated to a container gives it `/dev/kvm` and
//! `/dev/net/tun` (device cgroup rule + device node, permissions `rw`). A launcher pod asks
//! for one (`devices.microvirt.io/kvm: 1`), so at most `devices` launchers run per node.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use crate::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::api::registration_client::RegistrationClient;
use crate::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use crate::shutdown::Shutdown;

/// The API version string sent in `RegisterRequest.version`.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's default device-plugin directory.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket name inside the plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The extended resource launcher pods request.
pub const RESOURCE_NAME: &str = "devices.microvirt.io/kvm";
/// The plugin's socket name inside the plugin directory.
pub const DEFAULT_ENDPOINT: &str = "microvirt-kvm.sock";
/// Device IDs are `<prefix><index>`.
pub const DEVICE_ID_PREFIX: &str = "kvm-";
/// Health strings of the API.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// How long a Register call may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a stopping server may take to close its connections.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors of the device plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("creating the device-plugin directory {0}: {1}")]
    Dir(PathBuf, #[source] std::io::Error),
    #[error("binding the plugin socket {0}: {1}")]
    Bind(PathBuf, #[source] std::io::Error),
    #[error("removing the stale plugin socket {0}: {1}")]
    Stale(PathBuf, #[source] std::io::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// What the plugin advertises and where.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory (the plugin socket goes here).
    pub plugin_dir: PathBuf,
    /// The kubelet's registration socket (normally `<plugin_dir>/kubelet.sock`).
    pub kubelet_socket: PathBuf,
    /// File name of the plugin socket inside `plugin_dir`.
    pub endpoint: String,
    /// Extended resource name.
    pub resource_name: String,
    /// How many shareable devices to advertise.
    pub devices: u32,
    /// Host path of the KVM device (health-checked, injected as `/dev/kvm`).
    pub kvm_device: PathBuf,
    /// Host path of the TUN device (health-checked, injected as `/dev/net/tun`).
    pub tun_device: PathBuf,
    /// Where the host's root is seen for the health check: the devices are looked up at
    /// [`PluginConfig::check_path`] (a container mounts the host's /dev at `/host/dev` and
    /// sets this to `/host`; Allocate still names the host paths).
    pub check_root: PathBuf,
    /// How often the device nodes and the sockets are checked.
    pub poll_interval: Duration,
}

impl PluginConfig {
    /// Defaults for a node: the kubelet's directory, 1000 devices, the real device nodes.
    pub fn new(plugin_dir: impl Into<PathBuf>) -> Self {
        let plugin_dir = plugin_dir.into();
        Self {
            kubelet_socket: plugin_dir.join(KUBELET_SOCKET),
            plugin_dir,
            endpoint: DEFAULT_ENDPOINT.into(),
            resource_name: RESOURCE_NAME.into(),
            devices: 1000,
            kvm_device: "/dev/kvm".into(),
            tun_device: "/dev/net/tun".into(),
            check_root: "/".into(),
            poll_interval: Duration::from_secs(1),
        }
    }

    fn check(&self) -> Result<(), PluginError> {
        if self.devices == 0 {
            return Err(PluginError::Config("--devices must be at least 1".into()));
        }
        if self.endpoint.is_empty() || self.endpoint.contains('/') {
            return Err(PluginError::Config(format!(
                "--endpoint {:?} must be a plain file name",
                self.endpoint
            )));
        }
        if !valid_resource_name(&self.resource_name) {
            return Err(PluginError::Config(format!(
                "--resource-name {:?} must look like <domain>/<name>",
                self.resource_name
            )));
        }
        if self.poll_interval.is_zero() {
            return Err(PluginError::Config(
                "--poll-interval-ms must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Where the health check looks for the host path `dev`: `<check_root>/<dev>`.
    pub fn check_path(&self, dev: &Path) -> PathBuf {
        self.check_root.join(dev.strip_prefix("/").unwrap_or(dev))
    }

    /// The plugin socket's path.
    pub fn socket_path(&self) -> PathBuf {
        self.plugin_dir.join(&self.endpoint)
    }

    /// The device specs every allocated container gets.
    pub fn device_specs(&self) -> Vec<DeviceSpec> {
        vec![
            DeviceSpec {
                container_path: "/dev/kvm".into(),
                host_path: self.kvm_device.to_string_lossy().into_owned(),
                permissions: "rw".into(),
            },
            DeviceSpec {
                container_path: "/dev/net/tun".into(),
                host_path: self.tun_device.to_string_lossy().into_owned(),
                permissions: "rw".into(),
            },
        ]
    }
}

/// `<domain>/<name>`, both non-empty, no whitespace (the kubelet checks the details).
fn valid_resource_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((d, n)) => {
            !d.is_empty()
                && !n.is_empty()
                && !n.contains('/')
                && !s.chars().any(char::is_whitespace)
        }
        None => false,
    }
}

/// Device health as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => HEALTHY,
            Health::Unhealthy => UNHEALTHY,
        }
    }
}

/// Healthy when both device nodes exist.
pub fn probe_health(cfg: &PluginConfig) -> Health {
    if cfg.check_path(&cfg.kvm_device).exists() && cfg.check_path(&cfg.tun_device).exists() {
        Health::Healthy
    } else {
        Health::Unhealthy
    }
}

/// The device ID of index `i`.
pub fn device_id(i: u32) -> String {
    format!("{DEVICE_ID_PREFIX}{i}")
}

/// Index of a device ID we advertise (None for anything else).
fn device_index(id: &str, devices: u32) -> Option<u32> {
    let n = id.strip_prefix(DEVICE_ID_PREFIX)?;
    if n.is_empty() || (n.len() > 1 && n.starts_with('0')) || !n.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    n.parse::<u32>().ok().filter(|&i| i < devices)
}

/// The full device list with one health.
pub fn device_list(devices: u32, health: Health) -> ListAndWatchResponse {
    ListAndWatchResponse {
        devices: (0..devices)
            .map(|i| Device {
                id: device_id(i),
                health: health.as_str().into(),
                topology: None,
            })
            .collect(),
    }
}

/// The `DevicePlugin` service.
#[derive(Clone)]
struct PluginService {
    cfg: PluginConfig,
    health: watch::Receiver<Health>,
    /// Set when this server instance stops: open streams end.
    stop: watch::Receiver<bool>,
}

type ListAndWatchStream =
    Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListAndWatchStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut health = self.health.clone();
        let mut stop = self.stop.clone();
        let devices = self.cfg.devices;
        tokio::spawn(async move {
            loop {
                let h = *health.borrow_and_update();
                tracing::info!("ListAndWatch: {devices} devices {}", h.as_str());
                if tx.send(Ok(device_list(devices, h))).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = health.changed() => if r.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        // All devices are alike: the ones that must be included, then the first available.
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let want = usize::try_from(c.allocation_size.max(0)).unwrap_or(0);
                let mut ids: Vec<String> = c.must_include_device_i_ds;
                for id in c.available_device_i_ds {
                    if ids.len() >= want {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let req = req.into_inner();
        let mut container_responses = Vec::with_capacity(req.container_requests.len());
        for c in req.container_requests {
            if c.devices_ids.is_empty() {
                return Err(Status::invalid_argument(
                    "a container request names no device",
                ));
            }
            if let Some(bad) = c
                .devices_ids
                .iter()
                .find(|id| device_index(id, self.cfg.devices).is_none())
            {
                return Err(Status::invalid_argument(format!(
                    "unknown device id {bad:?} (this plugin has {}0..{}{})",
                    DEVICE_ID_PREFIX,
                    DEVICE_ID_PREFIX,
                    self.cfg.devices - 1
                )));
            }
            tracing::debug!("Allocate {:?}", c.devices_ids);
            container_responses.push(ContainerAllocateResponse {
                devices: self.cfg.device_specs(),
                ..Default::default()
            });
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: false,
    }
}

/// Identity of a file: device, inode and change time (a socket re-created between two polls
/// may get the same inode number back), None when it does not exist.
type FileId = (u64, u64, i64, i64);

fn file_id(p: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// A running gRPC server on the plugin socket.
struct ServingSocket {
    path: PathBuf,
    id: Option<FileId>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ServingSocket {
    fn start(cfg: &PluginConfig, health: watch::Receiver<Health>) -> Result<Self, PluginError> {
        let path = cfg.socket_path();
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(PluginError::Stale(path, e)),
        }
        let listener = UnixListener::bind(&path).map_err(|e| PluginError::Bind(path.clone(), e))?;
        let id = file_id(&path);
        let (stop_tx, stop_rx) = watch::channel(false);
        let svc = PluginService {
            cfg: cfg.clone(),
            health,
            stop: stop_rx.clone(),
        };
        let mut stop_signal = stop_rx;
        let task = tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stop_signal.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = r {
                tracing::warn!("device-plugin server: {e}");
            }
        });
        Ok(Self {
            path,
            id,
            stop: stop_tx,
            task,
        })
    }

    /// Whether our socket file is still the one we bound.
    fn intact(&self) -> bool {
        self.id.is_some() && file_id(&self.path) == self.id
    }

    async fn stop(mut self) {
        self.stop.send_replace(true);
        if tokio::time::timeout(SERVER_STOP_TIMEOUT, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        // Remove the file only if it is still ours (a new instance may have bound the path).
        if self.intact() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Calls `Register` on the kubelet once.
pub async fn register(cfg: &PluginConfig) -> Result<(), String> {
    let call = async {
        let channel = crate::unix_channel(&cfg.kubelet_socket)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        RegistrationClient::new(channel)
            .register(RegisterRequest {
                version: API_VERSION.into(),
                endpoint: cfg.endpoint.clone(),
                resource_name: cfg.resource_name.clone(),
                options: Some(options()),
            })
            .await
            .map_err(|s| format!("{}: {}", s.code(), s.message()))?;
        Ok(())
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", REGISTER_TIMEOUT.as_secs())),
    }
}

/// Polls the device nodes and publishes their health.
async fn watch_health(cfg: PluginConfig, tx: watch::Sender<Health>, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(cfg.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait() => return,
        }
        let h = probe_health(&cfg);
        if *tx.borrow() != h {
            tracing::warn!(
                "devices {} ({} / {})",
                h.as_str(),
                cfg.kvm_device.display(),
                cfg.tun_device.display()
            );
            tx.send_replace(h);
        }
    }
}

/// Why a served socket was given up.
enum Restart {
    Shutdown,
    PluginSocketGone,
    KubeletRestarted,
}

/// Runs the plugin until `shutdown`: serve, register, re-register after kubelet restarts.
pub async fn run(cfg: PluginConfig, shutdown: Shutdown) -> Result<(), PluginError> {
    cfg.check()?;
    std::fs::create_dir_all(&cfg.plugin_dir)
        .map_err(|e| PluginError::Dir(cfg.plugin_dir.clone(), e))?;
    let (health_tx, health_rx) = watch::channel(probe_health(&cfg));
    tokio::spawn(watch_health(cfg.clone(), health_tx, shutdown.clone()));
    let mut tick = tokio::time::interval(cfg.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if shutdown.is_set() {
            return Ok(());
        }
        let serving = ServingSocket::start(&cfg, health_rx.clone())?;
        tracing::info!("device plugin serving on {}", serving.path.display());
        // Register, retrying until the kubelet answers.
        let mut logged = false;
        let kubelet_id = loop {
            let id = file_id(&cfg.kubelet_socket);
            if id.is_some() {
                let r = tokio::select! {
                    r = register(&cfg) => r,
                    _ = shutdown.wait() => break None,
                };
                match r {
                    Ok(()) => break id,
                    Err(e) if !logged => {
                        tracing::warn!(
                            "registering with the kubelet at {}: {e} (retrying)",
                            cfg.kubelet_socket.display()
                        );
                        logged = true;
                    }
                    Err(_) => {}
                }
            } else if !logged {
                tracing::info!(
                    "waiting for the kubelet socket {}",
                    cfg.kubelet_socket.display()
                );
                logged = true;
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait() => break None,
            }
        };
        let why = if kubelet_id.is_none() {
            Restart::Shutdown
        } else {
            tracing::info!(
                "registered {} ({} devices) with the kubelet",
                cfg.resource_name,
                cfg.devices
            );
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.wait() => break Restart::Shutdown,
                }
                if !serving.intact() {
                    break Restart::PluginSocketGone;
                }
                if file_id(&cfg.kubelet_socket) != kubelet_id {
                    break Restart::KubeletRestarted;
                }
            }
        };
        serving.stop().await;
        match why {
            Restart::Shutdown => {
                tracing::info!("device plugin stopped");
                return Ok(());
            }
            Restart::PluginSocketGone => {
                tracing::info!(
                    "the plugin socket was removed (kubelet restart?): registering again"
                )
            }
            Restart::KubeletRestarted => {
                tracing::info!("kubelet.sock was re-created: registering again")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_round_trip() {
        assert_eq!(device_id(7), "kvm-7");
        assert_eq!(device_index("kvm-0", 1000), Some(0));
        assert_eq!(device_index("kvm-999", 1000), Some(999));
        for bad in [
            "kvm-1000", "kvm-", "kvm-01", "kvm--1", "gpu-1", "kvm-1x", "",
        ] {
            assert_eq!(device_index(bad, 1000), None, "{bad}");
        }
        let l = device_list(3, Health::Unhealthy);
        let ids: Vec<&str> = l.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["kvm-0", "kvm-1", "kvm-2"]);
        assert!(l.devices.iter().all(|d| d.health == UNHEALTHY));
    }

    #[test]
    fn config_checks() {
        let mut c = PluginConfig::new("/tmp/x");
        assert!(c.check().is_ok());
        c.devices = 0;
        assert!(c.check().unwrap_err().to_string().contains("--devices"));
        let mut c = PluginConfig::new("/tmp/x");
        c.endpoint = "a/b.sock".into();
        assert!(c.check().is_err());
        let mut c = PluginConfig::new("/tmp/x");
        for bad in ["kvm", "/kvm", "a/", "a/b/c", "a b/c"] {
            c.resource_name = bad.into();
            assert!(c.check().is_err(), "{bad}");
        }
    }

    #[test]
    fn health_check_paths() {
        let mut c = PluginConfig::new("/tmp/x");
        assert_eq!(c.check_path(&c.kvm_device), Path::new("/dev/kvm"));
        c.check_root = "/host".into();
        assert_eq!(c.check_path(&c.kvm_device), Path::new("/host/dev/kvm"));
        assert_eq!(c.check_path(&c.tun_device), Path::new("/host/dev/net/tun"));
    }

    #[test]
    fn specs_name_both_devices_rw() {
        let mut c = PluginConfig::new("/tmp/x");
        c.kvm_device = "/tmp/fake-kvm".into();
        let s = c.device_specs();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].container_path, "/dev/kvm");
        assert_eq!(s[0].host_path, "/tmp/fake-kvm");
        assert_eq!(s[1].container_path, "/dev/net/tun");
        assert_eq!(s[1].host_path, "/dev/net/tun");
        assert!(s.iter().all(|d| d.permissions == "rw"));
    }
}
