//! The console hub: the launcher is the single client of the VMM's serial socket and fans the
//! guest's output out to any number of attached consoles and to the launcher's stdout (the
//! terminal in `run`, the container log in pod mode), while their input (and, in `run`, the
//! terminal's) goes to the guest. A newly attached console first gets the last
//! [`REPLAY_BYTES`] of output.
//!
//! When the guest console goes to stdout, the launcher's own lines (its log, "guest booted")
//! go through the hub's [`LineGuard`] so they never land in the middle of a guest line: a line
//! that comes while the guest is mid-line waits until the guest ends it, or, if the guest does
//! not within [`HOLD`], the guest's line is ended (a line break) and the launcher's follows.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Output kept for consoles that attach later.
pub const REPLAY_BYTES: usize = 16 * 1024;
/// How long a launcher line waits for the guest to finish its line.
pub const HOLD: Duration = Duration::from_millis(250);

#[derive(Default)]
struct GuardState {
    /// The last guest byte written to stdout ended a line (or nothing was written yet).
    mid_line: bool,
    /// Launcher lines waiting for the guest's line to end, and since when.
    held: Vec<u8>,
    held_since: Option<Instant>,
}

/// Serializes the guest console on stdout with the launcher's lines on stderr (see the module
/// documentation).
#[derive(Default)]
pub struct LineGuard {
    state: Mutex<GuardState>,
}

impl LineGuard {
    fn lock(&self) -> std::sync::MutexGuard<'_, GuardState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A launcher line (with its newline): now at a line boundary, else held.
    pub fn line(&self, line: &[u8]) {
        let mut s = self.lock();
        if s.mid_line {
            s.held.extend_from_slice(line);
            s.held_since.get_or_insert_with(Instant::now);
        } else {
            let _ = std::io::stderr().lock().write_all(line);
        }
    }

    /// Guest output for stdout; held launcher lines follow once the guest ends its line.
    fn guest(&self, data: &[u8], out: &mut impl Write) {
        if data.is_empty() {
            return;
        }
        let mut s = self.lock();
        let mut rest = data;
        while !s.held.is_empty() {
            // Up to the end of the guest's current line, then the held lines.
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                break;
            };
            let _ = out.write_all(&rest[..=nl]);
            let _ = out.flush();
            rest = &rest[nl + 1..];
            let held = std::mem::take(&mut s.held);
            s.held_since = None;
            let _ = std::io::stderr().lock().write_all(&held);
        }
        let _ = out.write_all(rest);
        let _ = out.flush();
        s.mid_line = data.last() != Some(&b'\n');
    }

    /// Called regularly: lines held longer than [`HOLD`] end the guest's line and go out.
    fn tick(&self, out: &mut impl Write) {
        let mut s = self.lock();
        if s.held_since.is_some_and(|t| t.elapsed() >= HOLD) {
            let _ = out.write_all(b"\n");
            let _ = out.flush();
            let held = std::mem::take(&mut s.held);
            s.held_since = None;
            s.mid_line = false;
            let _ = std::io::stderr().lock().write_all(&held);
        }
    }
}

/// The guard of the hub that writes the guest console to stdout, if there is one.
static GUARD: OnceLock<Arc<LineGuard>> = OnceLock::new();

/// Writes one launcher line (`text` without its newline) to stderr, never in the middle of a
/// guest console line on stdout.
pub fn emit_line(text: &str) {
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    match GUARD.get() {
        Some(g) => g.line(line.as_bytes()),
        None => {
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
}

struct Shared {
    recent: VecDeque<u8>,
    clients: Vec<UnixStream>,
    /// The VMM's serial socket is closed (the VM ended).
    closed: bool,
}

/// Fans guest output out; forwards console input to the guest.
pub struct ConsoleHub {
    shared: Mutex<Shared>,
    to_guest: Mutex<UnixStream>,
}

impl ConsoleHub {
    /// Connects to the VMM's serial socket (retrying until `timeout`) and starts the output
    /// thread. `echo` also copies guest output to stdout (and makes [`emit_line`] respect the
    /// guest's lines); `stdin` also feeds the launcher's stdin to the guest.
    pub fn start(
        serial: &Path,
        echo: bool,
        stdin: bool,
        timeout: Duration,
    ) -> std::io::Result<Arc<Self>> {
        let end = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(serial) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= end => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let hub = Arc::new(ConsoleHub {
            shared: Mutex::new(Shared {
                recent: VecDeque::with_capacity(REPLAY_BYTES),
                clients: Vec::new(),
                closed: false,
            }),
            to_guest: Mutex::new(stream.try_clone()?),
        });
        let guard = if echo {
            let g = Arc::new(LineGuard::default());
            // One hub per process; a second one (never made) would not guard.
            let _ = GUARD.set(g.clone());
            Some(g)
        } else {
            None
        };
        // Woken regularly so held launcher lines do not wait for guest output forever.
        stream.set_read_timeout(Some(HOLD / 2))?;
        let h = hub.clone();
        std::thread::Builder::new()
            .name("console-out".into())
            .spawn(move || h.pump(stream, guard))?;
        if stdin {
            let h = hub.clone();
            std::thread::Builder::new()
                .name("console-in".into())
                .spawn(move || {
                    let mut buf = [0u8; 1024];
                    loop {
                        match std::io::stdin().lock().read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if h.input(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                })?;
        }
        Ok(hub)
    }

    fn pump(&self, mut from_guest: UnixStream, guard: Option<Arc<LineGuard>>) {
        let mut buf = [0u8; 4096];
        loop {
            let n = match from_guest.read(&mut buf) {
                Ok(0) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if let Some(g) = &guard {
                        g.tick(&mut std::io::stdout().lock());
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
                Ok(n) => n,
            };
            let data = &buf[..n];
            if let Some(g) = &guard {
                g.guest(data, &mut std::io::stdout().lock());
                g.tick(&mut std::io::stdout().lock());
            }
            let Ok(mut s) = self.shared.lock() else { break };
            for &b in data {
                if s.recent.len() == REPLAY_BYTES {
                    s.recent.pop_front();
                }
                s.recent.push_back(b);
            }
            // A client that cannot take the output (gone, or not reading) is dropped.
            s.clients.retain_mut(|c| c.write_all(data).is_ok());
        }
        if let Some(g) = &guard {
            // The guest is gone: whatever the launcher still holds goes out now.
            g.guest(b"", &mut std::io::stdout().lock());
            let mut s = g.lock();
            if !s.held.is_empty() {
                let _ = std::io::stdout().lock().write_all(b"\n");
                let held = std::mem::take(&mut s.held);
                let _ = std::io::stderr().lock().write_all(&held);
            }
            s.mid_line = false;
            s.held_since = None;
        }
        if let Ok(mut s) = self.shared.lock() {
            s.closed = true;
            for c in s.clients.drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    /// Waits (at most `timeout`) until the VMM closed the serial socket and the hub has
    /// written everything it got.
    pub fn wait_closed(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.shared.lock().map(|s| s.closed).unwrap_or(true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Attaches a console client: replays recent output, then streams output to it and its
    /// input to the guest until either side closes. `pending` is input the client already sent.
    pub fn attach(&self, client: UnixStream, pending: &[u8]) -> std::io::Result<()> {
        let mut writer = client.try_clone()?;
        {
            let mut s = self
                .shared
                .lock()
                .map_err(|_| std::io::Error::other("console hub poisoned"))?;
            if s.closed {
                return Err(std::io::Error::other("the VM has ended"));
            }
            writer.set_write_timeout(Some(Duration::from_secs(2)))?;
            let (a, b) = s.recent.as_slices();
            writer.write_all(a)?;
            writer.write_all(b)?;
            // Registered under the lock, so no output falls between the replay and the stream.
            s.clients.push(writer);
        }
        self.input(pending)?;
        let mut reader = client;
        let mut buf = [0u8; 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => self.input(&buf[..n])?,
            }
        }
    }

    fn input(&self, data: &[u8]) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.to_guest
            .lock()
            .map_err(|_| std::io::Error::other("console hub poisoned"))?
            .write_all(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a terminal shows: stdout and stderr in the order they were written.
    #[derive(Clone, Default)]
    struct Terminal(Arc<Mutex<Vec<u8>>>);

    impl Write for Terminal {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_launcher_line_waits_for_the_end_of_the_guest_line() {
        let g = LineGuard::default();
        let mut out = Terminal::default();
        g.guest(b"boot-timer: wr", &mut out);
        g.line(b"virt-launcher: guest booted\n");
        // Held: nothing of it reached stderr, and the guest's line goes on.
        assert_eq!(g.lock().held, b"virt-launcher: guest booted\n");
        g.guest(b"itten\nreset", &mut out);
        assert!(g.lock().held.is_empty(), "released at the guest's newline");
        assert!(g.lock().mid_line);
        assert_eq!(&*out.0.lock().unwrap(), b"boot-timer: written\nreset");
        // At a line boundary a launcher line goes out at once.
        g.guest(b"\n", &mut out);
        g.line(b"x\n");
        assert!(g.lock().held.is_empty());
    }

    #[test]
    fn a_guest_line_that_never_ends_is_broken_after_the_hold_time() {
        let g = LineGuard::default();
        let mut out = Terminal::default();
        g.guest(b"login: ", &mut out);
        g.line(b"virt-launcher: info: something\n");
        g.tick(&mut out);
        assert!(!g.lock().held.is_empty(), "held within the hold time");
        std::thread::sleep(HOLD + Duration::from_millis(20));
        g.tick(&mut out);
        assert!(g.lock().held.is_empty());
        assert!(!g.lock().mid_line);
        assert_eq!(&*out.0.lock().unwrap(), b"login: \n");
    }
}
