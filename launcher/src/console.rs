//! The console hub: the launcher is the single client of the VMM's serial socket and fans the
//! guest's output out to any number of attached consoles (and, in pod mode, to the launcher's
//! stdout, so `kubectl logs` shows the guest console), while their input goes to the guest.
//! A newly attached console first gets the last [`REPLAY_BYTES`] of output.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Output kept for consoles that attach later.
pub const REPLAY_BYTES: usize = 16 * 1024;

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
    /// thread. `echo` also copies guest output to stdout.
    pub fn start(serial: &Path, echo: bool, timeout: Duration) -> std::io::Result<Arc<Self>> {
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
        let h = hub.clone();
        std::thread::Builder::new()
            .name("console-out".into())
            .spawn(move || h.pump(stream, echo))?;
        Ok(hub)
    }

    fn pump(&self, mut from_guest: UnixStream, echo: bool) {
        let mut buf = [0u8; 4096];
        loop {
            let n = match from_guest.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let data = &buf[..n];
            if echo {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(data);
                let _ = out.flush();
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
        if let Ok(mut s) = self.shared.lock() {
            s.closed = true;
            for c in s.clients.drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
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
