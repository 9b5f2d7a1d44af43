//! The control socket: a unix stream socket speaking JSON lines.
//!
//! Each request is one line, `{"cmd": "<name>"}`; each answer is one line with `"ok": true` and
//! the result, or `"ok": false` and `"error"`. Several requests may share a connection.
//!
//! | cmd | effect | answer fields |
//! |---|---|---|
//! | `status` | none | `name`, `state` (starting, running, paused, shutting-down, stopped: `microvirt_crds::launcher_state`), `booted`, `bootTimeMs`, `vcpus`, `memMiB`, `disks`, `network`, `vmmSeccomp` (seccomp mode of the VMM thread: 2 = filter), `capEff` (the VMM thread's effective capabilities, hex), `threads` (every thread: `tid`, `name`, `seccomp`, `noNewPrivs`, `capEff`), `consoleDroppedBytes` (guest console output dropped because its reader fell behind) |
//! | `pause` | pause the vCPUs | `state` |
//! | `unpause` (or `resume`) | resume the vCPUs | `state` |
//! | `vcpu-state` | each vCPU's registers, LAPIC timer and pending vectors, the IOAPIC's pins (a guest that stopped making progress; the VM stays as it was) | `describe` |
//! | `shutdown` | graceful: Ctrl-Alt-Del, hard stop after the grace period | `state` |
//! | `stop` | hard stop now | `state` |
//! | `console` | after the `{"ok":true}` line the connection carries raw console bytes both ways | — |
//! | `watch` | none; the connection becomes a stream of `status` answers (see below) | as `status` |
//! | `snapshot` + `"dir": "/abs/path"` | pause, write a snapshot into the (absent or empty) directory, stay paused (`resume` continues); without `dir`, pod mode writes into `$MICROVIRT_ROOT/snapshot` (a VM pool's snapshot mount) | `state`, `dir`, sizes, `pausedUs`, `writeUs` |
//!
//! `console` needs the VMM's serial on a unix socket (pod mode; `run --console socket`).
//! `pause`, `unpause`/`resume`, `snapshot` and `vcpu-state` are the VMM's own protocol commands
//! (`vmm::control`, also served by `microvm --control-socket`): one protocol, one implementation.
//! Snapshot files are created and renamed on this (the connection's) thread; the VMM thread only
//! writes through the descriptors it is handed.
//!
//! `watch` (used by the node agent, `virt-handler`): the launcher answers at once with the
//! current `status` line, then writes a new `status` line whenever `state`, `booted` or
//! `reboots` changes, and repeats the current one at least every [`WATCH_KEEPALIVE`] (so a client that
//! went away is noticed and a client can tell a hung launcher). The stream ends when the
//! launcher exits (possibly right after a `"state":"stopped"` line, possibly before it). Requests sent after `watch` on the
//! same connection are ignored: use another connection for commands. Clients must accept
//! repeated identical lines and unknown fields. Launchers without `watch` answer
//! `{"ok":false,"error":"unknown command \"watch\""}`; clients then poll `status`. The
//! stream only writes to the accepted socket and waits on a futex (no new syscalls after
//! the VM is built).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use microvirt_crds::launcher_state::LauncherState;
use serde_json::{json, Value};
pub use vmm::control::ControlServer;
use vmm::control::{self, Connection, Flow};
use vmm::VmmController;

use crate::console::ConsoleHub;
use crate::status::{set_state, Event, SharedStatus, Status};

/// What the server acts on.
#[derive(Clone)]
pub struct Context {
    pub controller: VmmController,
    pub status: SharedStatus,
    pub events: Sender<Event>,
    pub console: Option<Arc<ConsoleHub>>,
    /// Where `snapshot` writes when the request names no `dir` (pod mode).
    pub snapshot_dir: Option<PathBuf>,
}

/// Binds `path` (mode 0660) and serves it from a thread, one thread per connection, through
/// the VMM's server ([`vmm::control::listen`]) with the launcher's command set.
pub fn serve(path: &Path, ctx: Context) -> std::io::Result<ControlServer> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Owner and group: in the pod the launcher runs as 107:107 (docs/launcher-pod.md); the
    // node agent and `kubectl exec` clients are root without capabilities, so they reach the
    // socket through group 107 (the agent's supplementalGroups, the pod's fsGroup).
    control::listen(path, 0o660, move |conn| handle(conn, &ctx))
}

/// A field of a `/proc/.../status` text.
fn status_field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// `Seccomp:` and `CapEff:` of a thread of this process.
fn thread_security(tid: i32) -> (Option<u64>, Option<String>) {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap_or_default();
    (
        status_field(&text, "Seccomp").and_then(|v| v.parse().ok()),
        status_field(&text, "CapEff"),
    )
}

/// Every thread of this process with its seccomp mode, `no_new_privs` and effective
/// capabilities (from `/proc/self/task/*/status`).
pub fn threads_security() -> Vec<Value> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out: Vec<(i64, Value)> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let tid: i64 = e.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(e.path().join("status")).ok()?;
            let num = |f| status_field(&text, f).and_then(|v| v.parse::<u64>().ok());
            Some((
                tid,
                json!({
                    "tid": tid,
                    "name": status_field(&text, "Name"),
                    "seccomp": num("Seccomp"),
                    "noNewPrivs": num("NoNewPrivs"),
                    "capEff": status_field(&text, "CapEff"),
                }),
            ))
        })
        .collect();
    out.sort_by_key(|(tid, _)| *tid);
    out.into_iter().map(|(_, v)| v).collect()
}

fn status_json(ctx: &Context) -> Value {
    let s = match ctx.status.lock() {
        Ok(s) => s.clone(),
        Err(_) => return json!({"ok": false, "error": "status unavailable"}),
    };
    let (seccomp, cap) = s.vmm_tid.map_or((None, None), thread_security);
    json!({
        "ok": true,
        "name": s.name,
        "state": s.state.as_str(),
        "booted": s.boot_time_ms.is_some(),
        "bootTimeMs": s.boot_time_ms,
        "reboots": s.reboots,
        "vcpus": s.vcpus,
        "memMiB": s.mem_mib,
        "disks": s.disks,
        "network": s.network,
        "vmmSeccomp": seccomp,
        "capEff": cap,
        "threads": threads_security(),
        "consoleDroppedBytes": s.console.as_ref().map(|q| q.dropped()),
    })
}

/// How often `watch` repeats an unchanged status.
pub const WATCH_KEEPALIVE: Duration = Duration::from_secs(30);

/// What a `watch` client is told about: a new line is sent when this changes.
fn watched(s: &Status) -> (LauncherState, bool, u64) {
    (s.state.clone(), s.boot_time_ms.is_some(), s.reboots)
}

/// Streams `status` lines to a `watch` client (see the module doc).
fn watch(w: &mut UnixStream, ctx: &Context) -> std::io::Result<()> {
    loop {
        let now = match ctx.status.lock() {
            Ok(s) => watched(&s),
            Err(_) => return Ok(()),
        };
        control::write_reply(w, &status_json(ctx))?;
        if now.0 == LauncherState::Stopped {
            return Ok(());
        }
        ctx.status
            .wait_while(WATCH_KEEPALIVE, |s| watched(s) == now);
    }
}

/// `pause`, `resume`/`unpause`, `snapshot` and `vcpu-state`: the VMM's own commands
/// ([`vmm::control::vm_command`]), with the launcher's state kept in step; `None` for other
/// commands.
fn vm_command(ctx: &Context, cmd: &str, mut req: Value) -> Option<Value> {
    let state = match cmd {
        "pause" | "snapshot" => LauncherState::Paused,
        "resume" | "unpause" => LauncherState::Running,
        // Reads the vCPUs and leaves the VM as it was.
        "vcpu-state" => return control::vm_command(&ctx.controller, cmd, &req),
        _ => return None,
    };
    if cmd == "snapshot" && req.get("dir").is_none() {
        if let (Some(d), Some(o)) = (&ctx.snapshot_dir, req.as_object_mut()) {
            o.insert("dir".into(), Value::String(d.display().to_string()));
        }
    }
    // A resume says "running" before the vCPUs go: the first resume of a restored VM records
    // its boot time while the VMM handles the request, and a `watch` client must not see
    // "booted" with the old "paused" in between (the node agent would report a pause that
    // never was). A refused request puts the old state back.
    let before = if state == LauncherState::Running {
        let old = ctx.status.lock().ok().map(|s| s.state.clone());
        set_state(&ctx.status, state.clone());
        old
    } else {
        None
    };
    let answer = control::vm_command(&ctx.controller, cmd, &req)?;
    if answer.get("ok") == Some(&Value::Bool(true)) {
        set_state(&ctx.status, state);
    } else if let Some(old) = before {
        set_state(&ctx.status, old);
    }
    Some(answer)
}

fn handle(conn: UnixStream, ctx: &Context) -> std::io::Result<()> {
    control::serve_connection(conn, |c, cmd, req| {
        if let Some(answer) = vm_command(ctx, cmd, req) {
            return Ok(Flow::Reply(answer));
        }
        Ok(match cmd {
            "status" => Flow::Reply(status_json(ctx)),
            "shutdown" => {
                answer_then_send(
                    &mut c.writer,
                    ctx,
                    Event::ShutdownRequested,
                    LauncherState::ShuttingDown,
                )?;
                Flow::Answered
            }
            "stop" => {
                answer_then_send(
                    &mut c.writer,
                    ctx,
                    Event::StopRequested,
                    LauncherState::Stopping,
                )?;
                Flow::Answered
            }
            "console" => match &ctx.console {
                None => Flow::Reply(
                    json!({"ok": false, "error": "the console is on the launcher's terminal"}),
                ),
                Some(hub) => {
                    control::write_reply(&mut c.writer, &json!({"ok": true}))?;
                    Flow::Handover(Box::new(move |c: Connection| {
                        // Bytes the client sent after the request line are console input.
                        let pending = c.reader.buffer().to_vec();
                        hub.attach(c.reader.into_inner(), &pending)
                    }))
                }
            },
            "watch" => Flow::Handover(Box::new(move |mut c: Connection| watch(&mut c.writer, ctx))),
            other => {
                Flow::Reply(json!({"ok": false, "error": format!("unknown command {other:?}")}))
            }
        })
    })
}

/// Answers a `stop` or `shutdown` request, then hands it to the runner. The answer goes first: once the runner has the event the launcher may exit at
/// any moment, and a reply written after that would be lost (the client would read EOF and
/// could not tell a carried-out stop from a crash). A runner that is already gone is exiting,
/// which is what the client asked for. The request is carried out even when the client left.
fn answer_then_send(
    w: &mut UnixStream,
    ctx: &Context,
    event: Event,
    state: LauncherState,
) -> std::io::Result<()> {
    let answered = control::write_reply(w, &json!({"ok": true, "state": state.as_str()}));
    let _ = w.flush();
    let _ = ctx.events.send(event);
    answered
}

/// Client side: sends `{"cmd": cmd}` and returns the answer ([`vmm::control::request`]).
pub fn request(socket: &Path, cmd: &str) -> std::io::Result<Value> {
    control::request(socket, &json!({ "cmd": cmd }))
}

/// Puts a terminal in raw mode until dropped.
pub struct RawTerminal {
    fd: i32,
    saved: libc::termios,
}

impl RawTerminal {
    /// Raw mode on `fd` when it is a terminal (None otherwise).
    pub fn enter(fd: i32) -> Option<Self> {
        Self::enter_with(fd, false)
    }

    /// Raw mode, but Ctrl-C / Ctrl-\ still raise SIGINT / SIGQUIT (the `run` console: Ctrl-C
    /// is the graceful shutdown, every other key goes to the guest as typed).
    pub fn enter_keep_signals(fd: i32) -> Option<Self> {
        Self::enter_with(fd, true)
    }

    fn enter_with(fd: i32, keep_signals: bool) -> Option<Self> {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            return None;
        }
        // SAFETY: termios is plain data that tcgetattr fills in.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is a terminal; `saved` is a valid termios we own.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the termios we own.
        unsafe { libc::cfmakeraw(&mut raw) };
        if keep_signals {
            // Also keep output processing so the launcher's own log lines end in CR LF.
            raw.c_lflag |= libc::ISIG;
            raw.c_oflag |= libc::OPOST;
        }
        // SAFETY: sets attributes of our terminal from a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(Self { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the attributes saved from the same terminal.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The detach key in a terminal: Ctrl-].
const DETACH: u8 = 0x1d;

/// Client side of `console`: stdin → guest, guest → stdout, until the launcher closes the
/// console (the VM ended) or, on a terminal, Ctrl-] is typed.
pub fn attach_console(socket: &Path) -> std::io::Result<()> {
    let mut s = UnixStream::connect(socket)?;
    control::write_reply(&mut s, &json!({"cmd": "console"}))?;
    // Read the answer byte by byte so no console output is swallowed by a buffer.
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b)? == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let answer: Value = serde_json::from_slice(&line).map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad answer: {e}"))
    })?;
    if answer.get("ok") != Some(&Value::Bool(true)) {
        let msg = answer
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("refused")
            .to_string();
        return Err(std::io::Error::other(msg));
    }
    let raw = RawTerminal::enter(libc::STDIN_FILENO);
    if raw.is_some() {
        eprint!("[console attached; Ctrl-] detaches]\r\n");
    }
    let interactive = raw.is_some();
    let mut to_guest = s.try_clone()?;
    let closer = s.try_clone()?;
    std::thread::Builder::new()
        .name("console-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 1024];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if interactive {
                    if let Some(i) = buf[..n].iter().position(|&c| c == DETACH) {
                        let _ = to_guest.write_all(&buf[..i]);
                        let _ = closer.shutdown(Shutdown::Both);
                        return;
                    }
                }
                if to_guest.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        })?;
    let mut stdout = std::io::stdout().lock();
    let mut buf = [0u8; 4096];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        stdout.write_all(&buf[..n])?;
        stdout.flush()?;
    }
    drop(raw);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusCell;
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc::channel;

    fn context(events: Sender<Event>) -> Context {
        Context {
            controller: VmmController::detached().unwrap(),
            status: Arc::new(StatusCell::new(Status::default())),
            events,
            console: None,
            snapshot_dir: None,
        }
    }

    /// The runner may end the launcher the moment it hears of a `stop` or `shutdown`: the
    /// answer must already be on its way then. Here the "runner" closes the launcher's side of
    /// the connection as soon as the event arrives, as a process exit would; the client still
    /// reads its answer (before the fix it read EOF: "bad answer \"\"").
    #[test]
    fn stop_and_shutdown_are_answered_before_the_runner_acts() {
        let is_stop = |e: &Event| matches!(e, Event::StopRequested);
        let is_shutdown = |e: &Event| matches!(e, Event::ShutdownRequested);
        for (cmd, state, want) in [
            ("stop", "stopping", &is_stop as &dyn Fn(&Event) -> bool),
            ("shutdown", "shutting-down", &is_shutdown),
        ] {
            for _ in 0..50 {
                let (tx, rx) = channel();
                let (client, server) = UnixStream::pair().unwrap();
                let server_side = server.try_clone().unwrap();
                let ctx = context(tx);
                let t = std::thread::spawn(move || handle(server, &ctx));
                let mut c = client.try_clone().unwrap();
                c.write_all(format!("{{\"cmd\":\"{cmd}\"}}\n").as_bytes())
                    .unwrap();
                let ev = rx.recv().unwrap();
                assert!(want(&ev), "{cmd}: another event");
                server_side.shutdown(Shutdown::Both).unwrap();
                let mut line = String::new();
                BufReader::new(client).read_line(&mut line).unwrap();
                let v: Value = serde_json::from_str(line.trim())
                    .unwrap_or_else(|e| panic!("{cmd}: answer {line:?}: {e}"));
                assert_eq!(v, json!({"ok": true, "state": state}));
                let _ = t.join().unwrap();
            }
        }
    }

    /// A request to a launcher whose runner is gone is still answered, and the connection
    /// serves further requests.
    #[test]
    fn stop_with_the_runner_gone_is_answered_and_the_connection_goes_on() {
        let (tx, rx) = channel();
        drop(rx);
        let (client, server) = UnixStream::pair().unwrap();
        let ctx = context(tx);
        let t = std::thread::spawn(move || handle(server, &ctx));
        let mut c = client.try_clone().unwrap();
        c.write_all(b"{\"cmd\":\"stop\"}\n{\"cmd\":\"pause\"}\n")
            .unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let lines: Vec<Value> = BufReader::new(client)
            .lines()
            .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0], json!({"ok": true, "state": "stopping"}));
        assert_eq!(lines[1], json!({"ok": false, "error": "the VM is gone"}));
        t.join().unwrap().unwrap();
    }
}
