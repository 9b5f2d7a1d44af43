//! The control protocol: a unix stream socket speaking JSON lines, one request `{"cmd": ...}`
//! per line, one answer per line with `"ok": true` (and results) or `"ok": false` and
//! `"error"`. `virt-launcher` serves it (with its own commands on top, e.g. `status`, `console`,
//! `shutdown`) and so does `microvm --control-socket PATH` ([`serve`]); both use the socket
//! ([`listen`]), the per-connection loop ([`serve_connection`], with their own command handler),
//! the framing and the VM commands ([`vm_command`]) here, so a client speaks to either the same
//! way.
//!
//! | cmd | effect | answer fields |
//! |---|---|---|
//! | `state` (`microvm`) / `status` | none | `state`: built, running, paused, rebooting, stopped; `reboots` (`microvm`): in-place reboots so far |
//! | `pause` | pause the vCPUs | `state` |
//! | `resume` (or `unpause`) | run the vCPUs | `state` |
//! | `snapshot` + `"dir": "/abs/path"` | pause if running, write a snapshot into the (absent or empty) directory, stay paused | `state`, `dir`, `ramBytes`, `touchedBytes`, `memoryBytes`, `overlayBytes`, `stateBytes`, `pausedUs`, `writeUs` |
//! | `shutdown` (`microvm`) | ask the guest to shut down: the ACPI power button when the guest armed it, else Ctrl-Alt-Del ([`Action::Shutdown`]) | `state` |
//! | `power-button` (`microvm`) | press the ACPI power button (refused without ACPI) | `state` |
//! | `stop` (`microvm`) | stop the VM now | `state` |
//!
//! A failed snapshot answers `ok: false` with the reason; the VM then runs (or stays paused)
//! as before and the directory is left as it was.
//!
//! Threads: the snapshot's files are created and renamed on the connection's thread; the VMM
//! thread only writes through the descriptors it is handed (see [`crate::snapshot`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::actions::{Action, VmmController};
use crate::lifecycle::VmState;

/// Longest request line; a client cannot make the server buffer without limit.
pub const MAX_LINE: u64 = 4096;

/// Reads one request line. `Ok(None)` at end of input; `Ok(Some(Err(answer)))` for a line that
/// is not a JSON object (the answer to send back).
pub fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Result<Value, Value>>> {
    let mut line = String::new();
    let n = reader.take(MAX_LINE).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(match serde_json::from_str::<Value>(line.trim()) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(json!({"ok": false, "error": "bad request: not a JSON object"})),
        Err(e) => Err(json!({"ok": false, "error": format!("bad request: {e}")})),
    }))
}

/// Writes one answer line.
pub fn write_reply(w: &mut impl Write, v: &Value) -> io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    w.write_all(line.as_bytes())
}

/// Client side: sends `req` and returns the answer.
pub fn request(socket: &Path, req: &Value) -> io::Result<Value> {
    let mut s = UnixStream::connect(socket)?;
    write_reply(&mut s, req)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(line.trim()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad answer {line:?}: {e}"),
        )
    })
}

fn state_answer(r: Result<VmState, String>) -> Value {
    match r {
        Ok(s) => json!({"ok": true, "state": s.to_string()}),
        Err(e) => json!({"ok": false, "error": e}),
    }
}

/// `snapshot`: `{"cmd": "snapshot", "dir": "/abs/path"}`.
pub fn snapshot_command(controller: &VmmController, req: &Value) -> Value {
    let dir = match req.get("dir").and_then(Value::as_str) {
        Some(d) if Path::new(d).is_absolute() => PathBuf::from(d),
        Some(d) => {
            return json!({"ok": false, "error": format!("snapshot: dir {d:?} must be an absolute path")})
        }
        None => return json!({"ok": false, "error": "snapshot: needs \"dir\": \"/path\""}),
    };
    match crate::snapshot::create(controller, &dir) {
        Ok(s) => json!({
            "ok": true,
            "state": VmState::Paused.to_string(),
            "dir": dir.display().to_string(),
            "ramBytes": s.ram_bytes,
            "touchedBytes": s.touched_bytes,
            "memoryBytes": s.memory_bytes,
            "overlayBytes": s.overlay_bytes,
            "stateBytes": s.state_bytes,
            "pausedUs": s.paused_us,
            "writeUs": s.write_us,
        }),
        Err(e) => json!({"ok": false, "error": e}),
    }
}

/// The VM commands every server answers alike (`pause`, `resume`/`unpause`, `snapshot`,
/// `vcpu-state`);
/// `None` for other commands.
pub fn vm_command(controller: &VmmController, cmd: &str, req: &Value) -> Option<Value> {
    Some(match cmd {
        "pause" => state_answer(controller.request(Action::Pause)),
        "resume" | "unpause" => state_answer(controller.request(Action::Resume)),
        "snapshot" => snapshot_command(controller, req),
        "vcpu-state" => match controller.describe() {
            Ok(v) => json!({"ok": true, "describe": v}),
            Err(e) => json!({"ok": false, "error": e}),
        },
        _ => return None,
    })
}

/// The socket file; removed when this is dropped.
pub struct ControlServer {
    path: PathBuf,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` (replacing a stale socket file) with permission bits `mode` and serves it from
/// a thread: each connection gets a thread of its own running `handle` (usually a
/// [`serve_connection`] with the server's command handler).
pub fn listen<H>(path: &Path, mode: u32, handle: H) -> io::Result<ControlServer>
where
    H: Fn(UnixStream) -> io::Result<()> + Clone + Send + 'static,
{
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let handle = handle.clone();
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle(conn) {
                            log::debug!("control connection: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    log::warn!("control: cannot spawn a connection thread: {e}");
                }
            }
        })?;
    Ok(ControlServer {
        path: path.to_path_buf(),
    })
}

/// One accepted connection: its buffered request side and its answer side.
pub struct Connection {
    pub reader: BufReader<UnixStream>,
    pub writer: UnixStream,
}

/// What a command handler did with one request (see [`serve_connection`]).
pub enum Flow<'a> {
    /// Write this answer line, then read the next request.
    Reply(Value),
    /// The handler wrote its answer itself; read the next request.
    Answered,
    /// The connection is no longer a request stream (a status stream, a console): it is handed
    /// to this function and no further request is read from it.
    Handover(Box<dyn FnOnce(Connection) -> io::Result<()> + 'a>),
}

/// Serves the requests of one connection until the client ends it: a line that is not a JSON
/// object is answered here ([`read_request`]); an object goes to `handler` with its `cmd` (`""`
/// when it has none), and the [`Flow`] it returns says what happens next. An error of the
/// handler ends the connection.
pub fn serve_connection<'a>(
    conn: UnixStream,
    mut handler: impl FnMut(&mut Connection, &str, Value) -> io::Result<Flow<'a>>,
) -> io::Result<()> {
    let writer = conn.try_clone()?;
    let mut c = Connection {
        reader: BufReader::new(conn),
        writer,
    };
    while let Some(req) = read_request(&mut c.reader)? {
        let flow = match req {
            Err(answer) => Flow::Reply(answer),
            Ok(req) => {
                let cmd = req
                    .get("cmd")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                handler(&mut c, &cmd, req)?
            }
        };
        match flow {
            Flow::Reply(answer) => write_reply(&mut c.writer, &answer)?,
            Flow::Answered => {}
            Flow::Handover(f) => return f(c),
        }
    }
    Ok(())
}

/// Binds `path` (mode 0600) and serves the `microvm` command set from a thread, one thread
/// per connection.
pub fn serve(path: &Path, controller: VmmController) -> io::Result<ControlServer> {
    listen(path, 0o600, move |conn| {
        serve_connection(conn, |_, cmd, req| {
            Ok(Flow::Reply(answer(&controller, cmd, &req)))
        })
    })
}

/// The answer of the `microvm` server to one request.
fn answer(controller: &VmmController, cmd: &str, req: &Value) -> Value {
    if let Some(a) = vm_command(controller, cmd, req) {
        return a;
    }
    match cmd {
        "state" | "status" => match controller.status() {
            Ok(s) => json!({
                "ok": true,
                "state": s.state.to_string(),
                "reboots": s.reboots,
            }),
            Err(e) => json!({"ok": false, "error": e}),
        },
        "shutdown" => state_answer(controller.request(Action::Shutdown)),
        "power-button" => state_answer(controller.request(Action::PowerButton)),
        "stop" => state_answer(controller.request(Action::Stop)),
        other => json!({"ok": false, "error": format!("unknown command {other:?}")}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing() {
        let mut input = io::Cursor::new(b"{\"cmd\":\"pause\"}\nnot json\n[1]\n".to_vec());
        let a = read_request(&mut input).unwrap().unwrap().unwrap();
        assert_eq!(a["cmd"], "pause");
        let b = read_request(&mut input).unwrap().unwrap().unwrap_err();
        assert_eq!(b["ok"], false);
        assert!(b["error"].as_str().unwrap().starts_with("bad request"));
        let c = read_request(&mut input).unwrap().unwrap().unwrap_err();
        assert!(c["error"].as_str().unwrap().contains("not a JSON object"));
        assert!(read_request(&mut input).unwrap().is_none());
        // An over-long line is cut at MAX_LINE and fails to parse instead of growing memory.
        let long = format!("{{\"cmd\":\"{}\"}}\n", "x".repeat(10_000));
        let mut input = io::Cursor::new(long.into_bytes());
        assert!(read_request(&mut input).unwrap().unwrap().is_err());
        let mut out = Vec::new();
        write_reply(&mut out, &json!({"ok": true})).unwrap();
        assert_eq!(out, b"{\"ok\":true}\n");
    }
}
