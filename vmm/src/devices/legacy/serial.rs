//! 8250 UART (vm-superio) on the port I/O bus, interrupt-driven through irqfd.
//!
//! Output goes to stdout, nowhere, or the client of a unix socket. A vCPU never writes to
//! those itself (a reader that stops reading would stall it, and device I/O stays off the vCPU
//! threads): the bytes the guest transmits go into an [`OutputQueue`] — bounded, the oldest
//! bytes dropped and counted when the reader falls behind — and the event-loop thread writes
//! them out with non-blocking writes, waiting for the descriptor to become writable again when
//! the reader is slow.
//!
//! Input comes from stdin or that socket and is fed from the event-loop thread, only as much as
//! the receive FIFO can take (no byte is dropped: when the FIFO is full the input source is
//! paused until the guest drains it).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vm_superio::serial::SerialEvents;
use vm_superio::Serial;
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;
use crate::devices::interrupt::IrqLine;
use crate::persist::Persist;

/// How much recent output a newly attached socket client is shown.
pub const REPLAY_BYTES: usize = 16 * 1024;
/// Output kept for a reader that is behind; beyond this the oldest bytes are dropped.
pub const OUTPUT_QUEUE_BYTES: usize = 64 * 1024;

struct QueueState {
    /// Not yet written to the reader.
    pending: VecDeque<u8>,
    /// The last [`REPLAY_BYTES`] (socket consoles: replayed to a client that attaches).
    recent: Option<VecDeque<u8>>,
    /// Whether a reader takes `pending` (stdout always; a socket only while a client is there).
    connected: bool,
}

/// Guest output on its way to the console (see the module documentation).
pub struct OutputQueue {
    state: Mutex<QueueState>,
    /// Signalled when `pending` stops being empty.
    ready: EventFd,
    dropped: AtomicU64,
}

impl std::fmt::Debug for OutputQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputQueue")
            .field("pending", &self.pending())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// Appends `buf` to `q`, dropping the oldest bytes beyond `cap`; returns how many were dropped.
fn push_bounded(q: &mut VecDeque<u8>, buf: &[u8], cap: usize) -> usize {
    if buf.len() >= cap {
        let dropped = q.len() + buf.len() - cap;
        q.clear();
        q.extend(&buf[buf.len() - cap..]);
        return dropped;
    }
    let over = (q.len() + buf.len()).saturating_sub(cap);
    q.drain(..over);
    q.extend(buf);
    over
}

impl OutputQueue {
    /// A queue for stdout (`replay` false: always connected) or a socket console (`replay`
    /// true: connected while a client is attached, recent output kept for the next one).
    pub fn new(replay: bool) -> io::Result<Self> {
        Ok(Self {
            state: Mutex::new(QueueState {
                pending: VecDeque::new(),
                recent: replay.then(|| VecDeque::with_capacity(REPLAY_BYTES)),
                connected: !replay,
            }),
            ready: EventFd::new(libc::EFD_NONBLOCK)?,
            dropped: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The guest's side: queue `buf`; never waits for the reader.
    pub fn push(&self, buf: &[u8]) {
        let mut s = self.lock();
        if let Some(r) = s.recent.as_mut() {
            push_bounded(r, buf, REPLAY_BYTES);
        }
        if !s.connected {
            return;
        }
        let was_empty = s.pending.is_empty();
        let dropped = push_bounded(&mut s.pending, buf, OUTPUT_QUEUE_BYTES);
        drop(s);
        if dropped > 0 {
            self.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
            crate::guest_log!(
                log::Level::Warn,
                "serial: the console reader is not keeping up; oldest output dropped ({} bytes so far)",
                self.dropped()
            );
        }
        if was_empty {
            let _ = self.ready.write(1);
        }
    }

    /// Bytes dropped because the reader was too slow.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Bytes waiting for the reader.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// The reader's side: hands pending bytes to `write` (a non-blocking write) until it takes
    /// everything (`Ok(true)`) or would block (`Ok(false)`).
    fn drain_into(&self, mut write: impl FnMut(&[u8]) -> io::Result<usize>) -> io::Result<bool> {
        let _ = self.ready.read();
        let mut s = self.lock();
        while !s.pending.is_empty() {
            let (front, _) = s.pending.as_slices();
            match write(front) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    s.pending.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// A socket client attached: it gets the recent output first, then everything new.
    fn connect(&self) {
        let mut s = self.lock();
        s.pending = s.recent.clone().unwrap_or_default();
        s.connected = true;
        if !s.pending.is_empty() {
            let _ = self.ready.write(1);
        }
    }

    /// The reader went away: nothing is queued until the next one.
    fn disconnect(&self) {
        let mut s = self.lock();
        s.connected = false;
        s.pending.clear();
    }
}

/// Where the guest's serial output goes.
#[derive(Clone)]
pub enum SerialOut {
    Sink,
    /// Queued for the event loop, which writes it to stdout or the socket client.
    Queue(Arc<OutputQueue>),
    /// Collected in memory (tests and embedders that handle the console themselves).
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Write for SerialOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SerialOut::Sink => {}
            SerialOut::Queue(q) => q.push(buf),
            SerialOut::Buffer(b) => b.lock().expect("buffer lock").extend_from_slice(buf),
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Signals the input side when the guest emptied the receive FIFO.
pub struct FifoDrained(Arc<EventFd>);

impl SerialEvents for FifoDrained {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {
        crate::guest_log!(log::Level::Debug, "serial: lost an output byte");
    }
    fn in_buffer_empty(&self) {
        let _ = self.0.write(1);
    }
}

pub struct SerialDevice {
    serial: Serial<IrqLine, FifoDrained, SerialOut>,
}

/// The UART's registers and receive FIFO, for snapshots (output and input sources are the
/// restoring VMM's own).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialState {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    #[serde(with = "crate::snapshot::blob::bytes")]
    pub in_buffer: Vec<u8>,
}

/// What a restored UART gets from the new VM: its interrupt line and where its output goes.
pub struct SerialArgs {
    pub irq: IrqLine,
    pub out: SerialOut,
}

/// Why a UART could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum SerialRestoreError {
    #[error(transparent)]
    EventFd(io::Error),
    #[error("serial state: {0}")]
    State(String),
}

impl Persist for SerialDevice {
    type State = SerialState;
    type Args<'a> = SerialArgs;
    type Error = SerialRestoreError;

    /// The registers and the receive FIFO.
    fn save(&self) -> SerialState {
        let s = self.serial.state();
        SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// A UART in the saved `state` ([`SerialDevice::fifo_drained`] is a new eventfd).
    fn restore(args: SerialArgs, state: &SerialState) -> Result<Self, SerialRestoreError> {
        let drained =
            Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(SerialRestoreError::EventFd)?);
        let s = vm_superio::serial::SerialState {
            baud_divisor_low: state.baud_divisor_low,
            baud_divisor_high: state.baud_divisor_high,
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let serial = Serial::from_state(&s, args.irq, FifoDrained(drained), args.out)
            .map_err(|e| SerialRestoreError::State(format!("{e:?}")))?;
        Ok(Self { serial })
    }
}

impl SerialDevice {
    /// A UART raising `irq`, writing to `out`. Returns the device and the eventfd
    /// that fires when the receive FIFO drains (for [`SerialConsole`]).
    pub fn new(irq: IrqLine, out: SerialOut) -> io::Result<(Self, Arc<EventFd>)> {
        let drained = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let serial = Serial::with_events(irq, FifoDrained(drained.clone()), out);
        Ok((Self { serial }, drained))
    }

    /// The eventfd that fires when the receive FIFO drains (for [`SerialConsole`]).
    pub fn fifo_drained(&self) -> Arc<EventFd> {
        self.serial.events().0.clone()
    }

    /// Back to the power-on registers with an empty receive FIFO (an in-place reboot); the
    /// output and the console input stay connected.
    pub fn reset(&mut self) -> io::Result<()> {
        let irq = self.serial.interrupt_evt().clone();
        let drained = FifoDrained(self.fifo_drained());
        let out = self.serial.writer().clone();
        self.serial = Serial::from_state(
            &vm_superio::serial::SerialState::default(),
            irq,
            drained,
            out,
        )
        .map_err(|e| io::Error::other(format!("serial reset: {e:?}")))?;
        Ok(())
    }

    /// Raises the interrupt line when the UART has an interrupt pending (IIR bit 0 clear).
    pub fn raise_if_pending(&self) {
        if self.serial.state().interrupt_identification & 1 == 0 {
            if let Err(e) = self.serial.interrupt_evt().trigger() {
                log::warn!("serial: raising the interrupt: {e}");
            }
        }
    }

    fn fifo_capacity(&self) -> usize {
        self.serial.fifo_capacity()
    }

    fn enqueue(&mut self, bytes: &[u8]) -> usize {
        self.serial.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if let (Some(d), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *d = self.serial.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(v), Ok(off)) = (data.first(), u8::try_from(offset)) {
            if let Err(e) = self.serial.write(off, *v) {
                crate::guest_log!(log::Level::Debug, "serial write: {e:?}");
            }
        }
    }

    fn register_name(&self, offset: u64) -> Option<&'static str> {
        // Names without DLAB (the divisor latch shares offsets 0 and 1).
        Some(match offset {
            0 => "THR/RBR",
            1 => "IER",
            2 => "IIR/FCR",
            3 => "LCR",
            4 => "MCR",
            5 => "LSR",
            6 => "MSR",
            7 => "SCR",
            _ => return None,
        })
    }
}

/// stdout opened for non-blocking writes without changing the flags the rest of the process
/// (and the shell it came from) sees on descriptor 1.
pub struct StdoutWriter {
    fd: OwnedFd,
    /// A socket: written with `send(MSG_DONTWAIT)`.
    socket: bool,
}

impl StdoutWriter {
    /// A terminal, pipe or FIFO is reopened through `/proc/self/fd/1` (a new open file
    /// description that can be non-blocking on its own); a socket is written with
    /// `MSG_DONTWAIT`; a regular file never blocks and is used as is.
    pub fn open() -> io::Result<Self> {
        // SAFETY: fstat writes into a stat struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, for descriptor 1.
        if unsafe { libc::fstat(1, &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let kind = st.st_mode & libc::S_IFMT;
        let dup = || {
            // SAFETY: duplicates descriptor 1; the new descriptor is owned below.
            let fd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        if kind == libc::S_IFREG {
            return Ok(Self {
                fd: dup()?,
                socket: false,
            });
        }
        if kind == libc::S_IFSOCK {
            return Ok(Self {
                fd: dup()?,
                socket: true,
            });
        }
        // SAFETY: open with a valid C string; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c"/proc/self/fd/1".as_ptr(),
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` was just opened and nothing else owns it.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            socket: false,
        })
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: writes from a valid buffer of `buf.len()` bytes to our descriptor.
        let n = unsafe {
            if self.socket {
                libc::send(
                    self.fd.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            } else {
                libc::write(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len())
            }
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// The console the serial port is connected to.
pub enum ConsoleIo {
    None,
    /// Input from stdin, output to stdout.
    Stdio {
        out: StdoutWriter,
    },
    /// A listening socket: one client at a time is the console.
    Socket {
        listener: UnixListener,
    },
}

const EV_DRAINED: u32 = 0;
const EV_STDIN: u32 = 1;
const EV_LISTENER: u32 = 2;
const EV_OUTPUT: u32 = 3;
const EV_STDOUT: u32 = 4;
const EV_CLIENT: u32 = 5;

/// Event-loop subscriber that moves input bytes into the UART and queued output to the
/// console.
pub struct SerialConsole {
    device: Arc<Mutex<SerialDevice>>,
    io: ConsoleIo,
    drained: Arc<EventFd>,
    queue: Option<Arc<OutputQueue>>,
    client: Option<UnixStream>,
    /// What the client (or stdin, stdout) is registered for.
    client_events: Option<EventSet>,
    stdin_registered: bool,
    stdout_registered: bool,
    /// Input waits for the guest to drain the receive FIFO.
    input_paused: bool,
    /// Input source is done (stdin at EOF).
    input_done: bool,
    /// Output waits for the descriptor to become writable.
    output_blocked: bool,
}

impl SerialConsole {
    /// `queue` is where the device's output goes ([`SerialOut::Queue`]) for `Stdio` and
    /// `Socket` consoles.
    pub fn new(
        device: Arc<Mutex<SerialDevice>>,
        io: ConsoleIo,
        drained: Arc<EventFd>,
        queue: Option<Arc<OutputQueue>>,
    ) -> Self {
        Self {
            device,
            io,
            drained,
            queue,
            client: None,
            client_events: None,
            stdin_registered: false,
            stdout_registered: false,
            input_paused: false,
            input_done: false,
            output_blocked: false,
        }
    }

    /// Brings the epoll registrations in line with the state.
    fn sync(&mut self, ops: &mut EventOps) {
        match &self.io {
            ConsoleIo::None => {}
            ConsoleIo::Stdio { out } => {
                let want_in = !self.input_paused && !self.input_done;
                if want_in != self.stdin_registered {
                    let ev = Events::with_data_raw(libc::STDIN_FILENO, EV_STDIN, EventSet::IN);
                    let r = if want_in { ops.add(ev) } else { ops.remove(ev) };
                    // stdin that epoll cannot watch (a regular file, /dev/null): no input.
                    self.stdin_registered = want_in && r.is_ok();
                    if want_in && r.is_err() {
                        self.input_done = true;
                    }
                }
                let want_out = self.output_blocked;
                if want_out != self.stdout_registered {
                    let ev = Events::with_data_raw(out.fd.as_raw_fd(), EV_STDOUT, EventSet::OUT);
                    let r = if want_out {
                        ops.add(ev)
                    } else {
                        ops.remove(ev)
                    };
                    self.stdout_registered = want_out && r.is_ok();
                }
            }
            ConsoleIo::Socket { .. } => {
                let Some(c) = &self.client else { return };
                let fd = c.as_raw_fd();
                let mut want = EventSet::empty();
                if !self.input_paused {
                    want |= EventSet::IN;
                }
                if self.output_blocked {
                    want |= EventSet::OUT;
                }
                let ev = Events::with_data_raw(fd, EV_CLIENT, want);
                let r = match self.client_events {
                    _ if want.is_empty() => {
                        if self.client_events.is_some() {
                            let _ = ops.remove(ev);
                        }
                        self.client_events = None;
                        return;
                    }
                    None => ops.add(ev),
                    Some(have) if have == want => return,
                    Some(_) => ops.modify(ev),
                };
                self.client_events = r.is_ok().then_some(want);
            }
        }
    }

    fn detach_client(&mut self, ops: &mut EventOps) {
        if let Some(c) = self.client.take() {
            if self.client_events.take().is_some() {
                let _ = ops.remove(Events::with_data_raw(
                    c.as_raw_fd(),
                    EV_CLIENT,
                    EventSet::empty(),
                ));
            }
        }
        if let Some(q) = &self.queue {
            q.disconnect();
        }
        self.output_blocked = false;
        self.input_paused = false;
    }

    fn read_input(&mut self, ops: &mut EventOps) {
        let cap = self.device.lock().expect("serial lock").fifo_capacity();
        if cap == 0 {
            // FIFO full: stop reading until the guest drains it.
            self.input_paused = true;
            self.sync(ops);
            return;
        }
        let mut buf = [0u8; 64];
        let want = cap.min(buf.len());
        let n = match &mut self.client {
            Some(c) => c.read(&mut buf[..want]),
            None => read_stdin(&mut buf[..want]),
        };
        match n {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(0) | Err(_) => {
                // EOF or error: this source is done (a socket client may reconnect).
                if self.client.is_some() {
                    self.detach_client(ops);
                } else {
                    self.input_done = true;
                    self.sync(ops);
                }
            }
            Ok(n) => {
                let taken = self.device.lock().expect("serial lock").enqueue(&buf[..n]);
                debug_assert_eq!(taken, n, "input was sized to the FIFO capacity");
            }
        }
    }

    fn write_output(&mut self, ops: &mut EventOps) {
        let Some(q) = self.queue.clone() else { return };
        let r = match (&self.io, &mut self.client) {
            (ConsoleIo::Stdio { out }, _) => q.drain_into(|b| out.write(b)),
            (ConsoleIo::Socket { .. }, Some(c)) => q.drain_into(|b| c.write(b)),
            _ => {
                let _ = q.drain_into(|b| Ok(b.len()));
                return;
            }
        };
        match r {
            Ok(done) => self.output_blocked = !done,
            Err(e) => {
                if self.client.is_some() {
                    self.detach_client(ops);
                    return;
                }
                crate::guest_log!(log::Level::Warn, "serial: writing the console: {e}");
                // Nothing can take the output any more: stop queueing it.
                q.disconnect();
                self.output_blocked = false;
            }
        }
        self.sync(ops);
    }

    fn accept(&mut self, ops: &mut EventOps) {
        let ConsoleIo::Socket { listener } = &self.io else {
            return;
        };
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        self.detach_client(ops);
        self.client = Some(stream);
        if let Some(q) = &self.queue {
            q.connect();
        }
        self.sync(ops);
        self.write_output(ops);
    }
}

/// Reads what fd 0 holds, up to `buf.len()` bytes, straight from the descriptor. Not through
/// `std::io::Stdin`: that buffers up to 8 KiB, and bytes held in its buffer are invisible to
/// epoll — a line longer than the receive FIFO was read whole into it, the FIFO took its first
/// 64 bytes, and the rest waited until the next keystroke made fd 0 readable again.
fn read_stdin(buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and `read(2)`
    // writes at most that many; fd 0 stays open for the life of the process.
    let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl MutEventSubscriber for SerialConsole {
    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::with_data(
            self.drained.as_ref(),
            EV_DRAINED,
            EventSet::IN,
        ));
        if let Some(q) = &self.queue {
            let _ = ops.add(Events::with_data(&q.ready, EV_OUTPUT, EventSet::IN));
        }
        if let ConsoleIo::Socket { listener } = &self.io {
            let _ = ops.add(Events::with_data(listener, EV_LISTENER, EventSet::IN));
        }
        self.sync(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let set = events.event_set();
        match events.data() {
            EV_DRAINED => {
                let _ = self.drained.read();
                if self.input_paused {
                    self.input_paused = false;
                    self.sync(ops);
                }
            }
            EV_STDIN => self.read_input(ops),
            EV_LISTENER => self.accept(ops),
            EV_OUTPUT | EV_STDOUT => self.write_output(ops),
            EV_CLIENT => {
                if set.contains(EventSet::OUT) {
                    self.write_output(ops);
                    if self.client.is_none() {
                        return;
                    }
                }
                if set.contains(EventSet::IN) {
                    self.read_input(ops);
                } else if set.intersects(EventSet::HANG_UP | EventSet::ERROR) {
                    self.detach_client(ops);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use event_manager::SubscriberOps;
    use std::time::{Duration, Instant};

    #[test]
    fn output_reaches_the_buffer_and_input_respects_fifo() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let irq = IrqLine::new(4).unwrap();
        let (mut dev, drained) =
            SerialDevice::new(irq.clone(), SerialOut::Buffer(out.clone())).unwrap();
        for b in b"hi" {
            dev.write(0, &[*b]);
        }
        assert_eq!(&*out.lock().unwrap(), b"hi");
        let cap = dev.fifo_capacity();
        assert!(cap > 0);
        let big = vec![b'x'; cap + 10];
        assert_eq!(dev.enqueue(&big[..cap]), cap);
        assert_eq!(dev.fifo_capacity(), 0);
        // The guest drains the FIFO: LSR data-ready then RBR reads.
        for _ in 0..cap {
            let mut b = [0u8];
            dev.read(0, &mut b);
            assert_eq!(b[0], b'x');
        }
        assert_eq!(drained.read().unwrap(), 1);
    }

    #[test]
    fn state_round_trip_keeps_registers_and_pending_input() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let (mut dev, _) =
            SerialDevice::new(IrqLine::new(4).unwrap(), SerialOut::Buffer(out.clone())).unwrap();
        dev.write(7, &[0x5a]); // scratch
        dev.write(1, &[0x01]); // IER: data available
        assert_eq!(dev.enqueue(b"ab"), 2);
        let st = dev.save();
        let json = serde_json::to_string(&st).unwrap();
        let back: SerialState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st);
        let args = SerialArgs {
            irq: IrqLine::new(4).unwrap(),
            out: SerialOut::Sink,
        };
        let mut r = SerialDevice::restore(args, &back).unwrap();
        assert_eq!(r.save(), st);
        let mut b = [0u8];
        r.read(7, &mut b);
        assert_eq!(b[0], 0x5a);
        r.read(0, &mut b);
        assert_eq!(b[0], b'a');
        r.read(0, &mut b);
        assert_eq!(b[0], b'b');
    }

    #[test]
    fn a_pending_interrupt_is_raised_again() {
        let irq = IrqLine::new(4).unwrap();
        let (mut dev, _) = SerialDevice::new(irq.clone(), SerialOut::Sink).unwrap();
        dev.raise_if_pending();
        assert!(irq.eventfd().read().is_err(), "nothing pending yet");
        dev.write(1, &[0x02]); // IER: THR empty -> interrupt pending at once
        assert_eq!(irq.eventfd().read().unwrap(), 1);
        dev.raise_if_pending();
        assert_eq!(irq.eventfd().read().unwrap(), 1, "raised again");
        let mut iir = [0u8];
        dev.read(2, &mut iir); // reading IIR clears the THRE interrupt
        dev.raise_if_pending();
        assert!(irq.eventfd().read().is_err());
    }

    #[test]
    fn bounded_push_drops_the_oldest() {
        let mut q = VecDeque::new();
        assert_eq!(push_bounded(&mut q, b"abcd", 6), 0);
        assert_eq!(push_bounded(&mut q, b"efg", 6), 1);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), b"bcdefg");
        assert_eq!(push_bounded(&mut q, b"0123456789", 6), 10);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), b"456789");
    }

    /// A socket console with its event loop on a thread of its own; returns the serial device,
    /// the queue and the path.
    fn socket_console(
        tag: &str,
    ) -> (
        Arc<Mutex<SerialDevice>>,
        Arc<OutputQueue>,
        std::path::PathBuf,
    ) {
        let path =
            std::env::temp_dir().join(format!("vmm-serial-{tag}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let queue = Arc::new(OutputQueue::new(true).unwrap());
        let (dev, drained) =
            SerialDevice::new(IrqLine::new(4).unwrap(), SerialOut::Queue(queue.clone())).unwrap();
        let dev = Arc::new(Mutex::new(dev));
        let console = SerialConsole::new(
            dev.clone(),
            ConsoleIo::Socket { listener },
            drained,
            Some(queue.clone()),
        );
        let mut em =
            event_manager::EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new()
                .unwrap();
        em.add_subscriber(Arc::new(Mutex::new(console)));
        std::thread::spawn(move || loop {
            if em.run_with_timeout(50).is_err() {
                return;
            }
        });
        (dev, queue, path)
    }

    #[test]
    fn socket_console_replays_recent_output_then_streams() {
        let (dev, _q, path) = socket_console("replay");
        for b in b"early output\n" {
            dev.lock().unwrap().write(0, &[*b]);
        }
        let mut c = UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while !got.ends_with(b"early output\n") {
            let n = c.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        for b in b"later" {
            dev.lock().unwrap().write(0, &[*b]);
        }
        while !got.ends_with(b"later") {
            let n = c.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"early output\nlater");
        let _ = std::fs::remove_file(&path);
    }

    /// A console client that stops reading cannot stall the vCPU writing to the UART: the
    /// writes keep completing, the oldest output is dropped and counted, and the reader gets
    /// the newest output once it reads again.
    #[test]
    fn a_reader_that_stops_reading_cannot_stall_the_guest() {
        let (dev, q, path) = socket_console("stall");
        let mut c = UnixStream::connect(&path).unwrap();
        // Attached once the (empty) replay is done; nothing is read from here on.
        let end = Instant::now() + Duration::from_secs(5);
        while !q.lock().connected {
            assert!(Instant::now() < end, "client never attached");
            std::thread::sleep(Duration::from_millis(5));
        }
        const TOTAL: usize = 4 << 20;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let d = dev.clone();
        std::thread::spawn(move || {
            for i in 0..TOTAL {
                // What the vCPU does for each byte the guest transmits.
                let b = b'a' + (i % 26) as u8;
                d.lock().unwrap().write(0, &[b]);
            }
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the writer is stuck behind a reader that does not read");
        assert!(q.dropped() > 0, "nothing dropped");
        assert!(q.pending() <= OUTPUT_QUEUE_BYTES);
        // Reading again: what arrives ends with the newest bytes.
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let want_tail: Vec<u8> = (TOTAL - 1000..TOTAL)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        assert!(got.ends_with(&want_tail), "got {} bytes", got.len());
        assert_eq!(got.len() as u64 + q.dropped(), TOTAL as u64);
        let _ = std::fs::remove_file(&path);
    }
}
