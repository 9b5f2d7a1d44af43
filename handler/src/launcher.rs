//! Client of a launcher's control socket (JSON lines; the protocol is documented in
//! `launcher/src/control.rs`), as seen from the node.
//!
//! The socket lives in the launcher pod's `runtime` emptyDir, which the kubelet keeps at
//! `<kubelet root>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/runtime/` on the node; the
//! agent reaches it through a hostPath mount of the kubelet root. That path is longer than a
//! unix socket address may be (108 bytes), so long paths are dialled through
//! `/proc/self/fd/<directory fd>/control.sock`.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use microvirt_crds::launcher_state::LauncherState;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// Longest path `connect(2)` takes for a unix socket (sun_path minus the NUL).
const SUN_PATH_MAX: usize = 107;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest answer line accepted.
const LINE_MAX: usize = 64 * 1024;

/// Errors talking to a launcher.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("connecting to {0}: {1}")]
    Connect(PathBuf, #[source] std::io::Error),
    #[error("talking to the launcher: {0}")]
    Io(#[from] std::io::Error),
    #[error("the launcher closed the connection")]
    Closed,
    #[error("bad answer from the launcher: {0}")]
    BadAnswer(String),
    #[error("the launcher refused {cmd:?}: {error}")]
    Refused { cmd: String, error: String },
    #[error("no answer within {0} s")]
    Timeout(u64),
}

/// The node path of a launcher pod's control socket.
pub fn control_socket_path(
    kubelet_root: &Path,
    pod_uid: &str,
    runtime_volume: &str,
    socket_name: &str,
) -> PathBuf {
    kubelet_root
        .join("pods")
        .join(pod_uid)
        .join("volumes")
        .join("kubernetes.io~empty-dir")
        .join(runtime_volume)
        .join(socket_name)
}

/// Connects to a unix socket, also when its path is too long for a socket address.
pub async fn connect(path: &Path) -> Result<UnixStream, LauncherError> {
    let err = |e| LauncherError::Connect(path.to_path_buf(), e);
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return UnixStream::connect(path).await.map_err(err);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    };
    // The directory stays open while we connect through its /proc/self/fd link.
    let d = std::fs::File::open(dir).map_err(err)?;
    let short = Path::new("/proc/self/fd")
        .join(d.as_raw_fd().to_string())
        .join(name);
    let r = UnixStream::connect(&short).await.map_err(err);
    drop(d);
    r
}

/// What the agent needs from a `status` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LauncherStatus {
    /// As the launcher wrote it (a newer launcher's state is kept as `Other`).
    pub state: LauncherState,
    pub booted: bool,
    pub boot_time_ms: Option<u64>,
}

impl LauncherStatus {
    /// Parses a `status` answer (`ok: false` becomes an error).
    pub fn from_answer(v: &Value) -> Result<Self, LauncherError> {
        check_ok(v, "status")?;
        let state = v
            .get("state")
            .and_then(Value::as_str)
            .ok_or_else(|| LauncherError::BadAnswer(format!("no state in {v}")))?;
        Ok(Self {
            state: LauncherState::parse(state),
            booted: v.get("booted").and_then(Value::as_bool).unwrap_or(false),
            boot_time_ms: v.get("bootTimeMs").and_then(Value::as_u64),
        })
    }

    /// Whether the vCPUs are paused.
    pub fn paused(&self) -> bool {
        self.state == LauncherState::Paused
    }
}

fn check_ok(v: &Value, cmd: &str) -> Result<(), LauncherError> {
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(()),
        Some(false) => Err(LauncherError::Refused {
            cmd: cmd.to_string(),
            error: v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no reason given")
                .to_string(),
        }),
        None => Err(LauncherError::BadAnswer(v.to_string())),
    }
}

/// One open connection.
struct Conn {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Conn {
    async fn open(path: &Path) -> Result<Self, LauncherError> {
        let (r, w) = connect(path).await?.into_split();
        Ok(Self {
            lines: BufReader::new(r).lines(),
            write: w,
        })
    }

    async fn send(&mut self, cmd: &str) -> Result<(), LauncherError> {
        self.send_value(&json!({ "cmd": cmd })).await
    }

    async fn send_value(&mut self, req: &Value) -> Result<(), LauncherError> {
        let mut line = req.to_string();
        line.push('\n');
        self.write.write_all(line.as_bytes()).await?;
        Ok(())
    }

    async fn next(&mut self) -> Result<Value, LauncherError> {
        let line = self.lines.next_line().await?.ok_or(LauncherError::Closed)?;
        if line.len() > LINE_MAX {
            return Err(LauncherError::BadAnswer("answer line too long".into()));
        }
        serde_json::from_str(&line).map_err(|e| LauncherError::BadAnswer(format!("{line:?}: {e}")))
    }
}

/// Sends one command and returns its (successful) answer.
pub async fn request(path: &Path, cmd: &str) -> Result<Value, LauncherError> {
    request_json(path, &json!({ "cmd": cmd }), REQUEST_TIMEOUT).await
}

/// Sends the request `req` (`{"cmd": …, …}`) and returns its (successful) answer, waiting at
/// most `timeout` (a snapshot takes longer than a pause).
pub async fn request_json(
    path: &Path,
    req: &Value,
    timeout: Duration,
) -> Result<Value, LauncherError> {
    let cmd = req
        .get("cmd")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    let call = async {
        let mut c = Conn::open(path).await?;
        c.send_value(req).await?;
        let v = c.next().await?;
        check_ok(&v, &cmd)?;
        Ok(v)
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| LauncherError::Timeout(timeout.as_secs()))?
}

/// A stream of status changes: the launcher's `watch`, or polling `status` on launchers
/// that do not have it.
pub struct StatusWatch {
    conn: Conn,
    path: PathBuf,
    /// Some(period) when polling.
    poll: Option<Duration>,
    first: Option<LauncherStatus>,
    last: Option<LauncherStatus>,
}

impl StatusWatch {
    /// Opens the watch; launchers without `watch` are polled every `poll`.
    pub async fn open(path: &Path, poll: Duration) -> Result<Self, LauncherError> {
        let mut conn = tokio::time::timeout(REQUEST_TIMEOUT, Conn::open(path))
            .await
            .map_err(|_| LauncherError::Timeout(REQUEST_TIMEOUT.as_secs()))??;
        conn.send("watch").await?;
        let v = tokio::time::timeout(REQUEST_TIMEOUT, conn.next())
            .await
            .map_err(|_| LauncherError::Timeout(REQUEST_TIMEOUT.as_secs()))??;
        let (first, poll) = match LauncherStatus::from_answer(&v) {
            Ok(s) => (s, None),
            Err(LauncherError::Refused { error, .. }) if error.contains("unknown command") => {
                tracing::debug!("{}: no watch command, polling status", path.display());
                conn.send("status").await?;
                (
                    LauncherStatus::from_answer(&conn.next().await?)?,
                    Some(poll),
                )
            }
            Err(e) => return Err(e),
        };
        Ok(Self {
            conn,
            path: path.to_path_buf(),
            poll,
            first: Some(first),
            last: None,
        })
    }

    /// The next status that differs from the previous one. Errors when the launcher goes away.
    pub async fn next(&mut self) -> Result<LauncherStatus, LauncherError> {
        loop {
            let s = if let Some(s) = self.first.take() {
                s
            } else if let Some(period) = self.poll {
                tokio::time::sleep(period).await;
                self.conn.send("status").await?;
                LauncherStatus::from_answer(&self.conn.next().await?)?
            } else {
                LauncherStatus::from_answer(&self.conn.next().await?)?
            };
            if self.last.as_ref() != Some(&s) {
                self.last = Some(s.clone());
                return Ok(s);
            }
        }
    }

    /// The socket this watch reads.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_path_layout() {
        let p = control_socket_path(
            Path::new("/var/lib/kubelet"),
            "0a1b",
            "runtime",
            "control.sock",
        );
        assert_eq!(
            p,
            Path::new(
                "/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~empty-dir/runtime/control.sock"
            )
        );
    }

    #[test]
    fn status_answers() {
        let s = LauncherStatus::from_answer(
            &json!({"ok": true, "state": "paused", "booted": true, "bootTimeMs": 12, "x": 1}),
        )
        .unwrap();
        assert!(s.paused());
        assert_eq!(s.boot_time_ms, Some(12));
        let e = LauncherStatus::from_answer(&json!({"ok": false, "error": "nope"})).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        assert!(LauncherStatus::from_answer(&json!({"ok": true})).is_err());
        assert!(LauncherStatus::from_answer(&json!([1])).is_err());
    }

    #[tokio::test]
    async fn long_socket_paths_connect() {
        let dir = std::env::temp_dir().join(format!(
            "mv-handler-long-{}/{}",
            std::process::id(),
            "d".repeat(120)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.sock");
        assert!(path.as_os_str().len() > SUN_PATH_MAX);
        // Bind through the same /proc/self/fd trick, then connect by the long path.
        let d = std::fs::File::open(&dir).unwrap();
        let short = format!("/proc/self/fd/{}/control.sock", d.as_raw_fd());
        let l = std::os::unix::net::UnixListener::bind(&short).unwrap();
        drop(d);
        let conn = connect(&path).await;
        let accepted = l.accept();
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
        conn.unwrap();
        accepted.unwrap();
    }
}
