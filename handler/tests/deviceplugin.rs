//! The device plugin end to end over real gRPC: the real `virt-handler` binary (device plugin
//! only: `--no-node-agent`) against a stand-in kubelet built from the same proto. The stand-in
//! serves `Registration` on `<dir>/kubelet.sock` in a temp directory and, like the kubelet,
//! dials the plugin's socket to call `GetDevicePluginOptions`, `ListAndWatch` and `Allocate`.
//! The device nodes are files in the temp directory (`--kvm-device`, `--tun-device`) so the
//! test can remove and re-create them. The real kubelet is exercised by the whole-system
//! tests on the real node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use microvirt_handler::api::device_plugin_client::DevicePluginClient;
use microvirt_handler::api::registration_server::{Registration, RegistrationServer};
use microvirt_handler::api::{
    AllocateRequest, ContainerAllocateRequest, Empty, ListAndWatchResponse, RegisterRequest,
};
use microvirt_testsupport::{Spawned, TempDir};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const ENDPOINT: &str = "microvirt-kvm.sock";
const WAIT: Duration = Duration::from_secs(20);

/// The `virt-handler` process (its output collected), killed on drop.
fn spawn_handler(dir: &Path, devices: u32) -> Spawned {
    Spawned::spawn(
        Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .arg("--no-node-agent")
            .arg("--device-plugin-dir")
            .arg(dir)
            .arg("--kvm-device")
            .arg(dir.join("kvm"))
            .arg("--tun-device")
            .arg(dir.join("tun"))
            .arg("--devices")
            .arg(devices.to_string())
            .arg("--poll-interval-ms")
            .arg("50")
            .env("RUST_LOG", "info"),
    )
}

struct Reg(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Reg {
    async fn register(&self, r: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = r.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let _ = self.0.send(r);
        Ok(Response::new(Empty {}))
    }
}

/// The stand-in kubelet's registration server.
struct FakeKubelet {
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    regs: mpsc::UnboundedReceiver<RegisterRequest>,
}

impl FakeKubelet {
    fn start(dir: &Path) -> Self {
        let sock = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).unwrap();
        let (tx, regs) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Reg(tx)))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            dir: dir.to_path_buf(),
            stop: Some(stop_tx),
            task,
            regs,
        }
    }

    /// The next Register call.
    async fn registration(&mut self) -> RegisterRequest {
        tokio::time::timeout(WAIT, self.regs.recv())
            .await
            .expect("no Register call in time")
            .expect("registration server ended")
    }

    /// Stops serving and removes kubelet.sock.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(WAIT, &mut self.task).await;
        let _ = std::fs::remove_file(self.dir.join("kubelet.sock"));
    }
}

async fn plugin_client(dir: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    let ch = microvirt_handler::unix_channel(&dir.join(ENDPOINT))
        .await
        .expect("dialling the plugin socket");
    DevicePluginClient::new(ch)
}

async fn next_list(s: &mut tonic::Streaming<ListAndWatchResponse>) -> ListAndWatchResponse {
    tokio::time::timeout(WAIT, s.message())
        .await
        .expect("no ListAndWatch update in time")
        .expect("ListAndWatch failed")
        .expect("ListAndWatch ended")
}

fn healths(l: &ListAndWatchResponse) -> Vec<&str> {
    let mut h: Vec<&str> = l.devices.iter().map(|d| d.health.as_str()).collect();
    h.dedup();
    h
}

fn make_devices(dir: &Path) {
    std::fs::write(dir.join("kvm"), b"").unwrap();
    std::fs::write(dir.join("tun"), b"").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_lists_watches_health_and_allocates() {
    let dir = TempDir::new("main");
    make_devices(dir.path());
    let mut kubelet = FakeKubelet::start(dir.path());
    let _handler = spawn_handler(dir.path(), 1000);

    let reg = kubelet.registration().await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, ENDPOINT);
    assert_eq!(reg.resource_name, "devices.microvirt.io/kvm");
    let opts = reg.options.expect("options sent");
    assert!(!opts.pre_start_required);

    let mut client = plugin_client(dir.path()).await;
    let o = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(o, opts);

    // The full list: 1000 distinct devices, all healthy.
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream).await;
    assert_eq!(first.devices.len(), 1000);
    let mut ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1000);
    assert_eq!(healths(&first), ["Healthy"]);

    // /dev/kvm goes away → all unhealthy; back → healthy. Same for /dev/net/tun.
    for dev in ["kvm", "tun"] {
        std::fs::remove_file(dir.join(dev)).unwrap();
        let l = next_list(&mut stream).await;
        assert_eq!(l.devices.len(), 1000);
        assert_eq!(healths(&l), ["Unhealthy"], "after removing {dev}");
        std::fs::write(dir.join(dev), b"").unwrap();
        let l = next_list(&mut stream).await;
        assert_eq!(healths(&l), ["Healthy"], "after re-creating {dev}");
    }

    // A second watcher gets the current list at once.
    let mut second = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(healths(&next_list(&mut second).await), ["Healthy"]);

    // Allocate: every container gets /dev/kvm and /dev/net/tun, rw.
    let resp = client
        .allocate(AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest {
                    devices_ids: vec![first.devices[0].id.clone()],
                },
                ContainerAllocateRequest {
                    devices_ids: vec![first.devices[1].id.clone(), first.devices[999].id.clone()],
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses.len(), 2);
    for c in &resp.container_responses {
        let specs: Vec<(&str, String, &str)> = c
            .devices
            .iter()
            .map(|d| {
                (
                    d.container_path.as_str(),
                    d.host_path.clone(),
                    d.permissions.as_str(),
                )
            })
            .collect();
        assert_eq!(
            specs,
            [
                ("/dev/kvm", dir.join("kvm").display().to_string(), "rw"),
                ("/dev/net/tun", dir.join("tun").display().to_string(), "rw"),
            ]
        );
        assert!(c.mounts.is_empty() && c.envs.is_empty());
    }

    // Unknown IDs and empty requests are refused.
    for ids in [vec!["kvm-1000".to_string()], vec!["gpu-0".into()], vec![]] {
        let e = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{ids:?}: {e}");
    }
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_again_when_the_kubelet_restarts() {
    let dir = TempDir::new("restart");
    make_devices(dir.path());
    let mut kubelet = FakeKubelet::start(dir.path());
    let _handler = spawn_handler(dir.path(), 3);
    kubelet.registration().await;
    let mut client = plugin_client(dir.path()).await;
    let mut old_stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut old_stream).await.devices.len(), 3);

    // 1. What a kubelet restart does: its socket and every plugin socket are deleted, then a
    //    new kubelet.sock appears.
    kubelet.stop().await;
    std::fs::remove_file(dir.join(ENDPOINT)).unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let reg = kubelet.registration().await;
    assert_eq!(reg.endpoint, ENDPOINT);
    // The old server stopped: its stream ends.
    let end = tokio::time::timeout(WAIT, old_stream.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    // The new socket serves.
    let mut client = plugin_client(dir.path()).await;
    let mut s = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(healths(&next_list(&mut s).await), ["Healthy"]);

    // 2. Only the plugin socket deleted.
    std::fs::remove_file(dir.join(ENDPOINT)).unwrap();
    kubelet.registration().await;
    assert!(dir.join(ENDPOINT).exists());

    // 3. Only kubelet.sock re-created (the plugin socket left in place).
    kubelet.stop().await;
    let mut kubelet = FakeKubelet::start(dir.path());
    kubelet.registration().await;
    let mut client = plugin_client(dir.path()).await;
    let mut s = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut s).await.devices.len(), 3);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_the_kubelet_then_registers() {
    let dir = TempDir::new("late");
    make_devices(dir.path());
    let _handler = spawn_handler(dir.path(), 1);
    // The plugin serves before the kubelet exists.
    let t0 = Instant::now();
    while !dir.join(ENDPOINT).exists() {
        assert!(t0.elapsed() < WAIT, "the plugin socket never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut kubelet = FakeKubelet::start(dir.path());
    assert_eq!(
        kubelet.registration().await.resource_name,
        "devices.microvirt.io/kvm"
    );
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_serving_and_exits_zero() {
    let dir = TempDir::new("term");
    make_devices(dir.path());
    let mut kubelet = FakeKubelet::start(dir.path());
    let mut handler = spawn_handler(dir.path(), 10);
    kubelet.registration().await;
    let mut client = plugin_client(dir.path()).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    next_list(&mut stream).await;

    handler.signal(libc::SIGTERM);
    // Bounded wait, not a speed assertion: the process must exit by itself.
    let code = tokio::task::block_in_place(|| handler.wait(WAIT).0.code());
    assert_eq!(
        code,
        Some(0),
        "virt-handler did not exit 0 after SIGTERM; {}",
        handler.output()
    );
    assert!(
        !dir.join(ENDPOINT).exists(),
        "the plugin socket is left behind"
    );
    let end = tokio::time::timeout(WAIT, stream.message()).await.unwrap();
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let dir = TempDir::new("twice");
    make_devices(dir.path());
    let mut kubelet = FakeKubelet::start(dir.path());
    let mut handler = spawn_handler(dir.path(), 1);
    kubelet.registration().await;
    // Both signals become pending while the process is stopped and are handled together on
    // SIGCONT: the second one must end the process with the forced-exit status.
    // Stopped means every thread stopped: a thread still running after a bare SIGSTOP could
    // take the SIGTERM alone and start the graceful exit.
    microvirt_testsupport::stop_process(handler.id()).expect("stopping virt-handler");
    handler.signal(libc::SIGTERM);
    handler.signal(libc::SIGINT);
    handler.signal(libc::SIGCONT);
    let code = tokio::task::block_in_place(|| handler.wait(WAIT).0.code());
    assert_eq!(code, Some(130), "{}", handler.output());
    kubelet.stop().await;
}
