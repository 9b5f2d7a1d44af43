//! 8250 UART (vm-superio) on the port I/O bus, interrupt-driven through irqfd.
//!
//! Output goes to stdout, nowhere, or the client of a unix socket. Input comes
//! from stdin or that socket and is fed from the event-loop thread, only as
//! much as the receive FIFO can take (no byte is dropped: when the FIFO is full
//! the input source is paused until the guest drains it).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vm_superio::serial::SerialEvents;
use vm_superio::Serial;
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;
use crate::devices::interrupt::IrqLine;

/// How much recent output a newly attached socket client is shown.
const REPLAY_BYTES: usize = 16 * 1024;

/// The connected console client of a unix-socket serial, with recent output kept for replay.
#[derive(Default)]
pub struct SocketConsole {
    client: Option<UnixStream>,
    recent: VecDeque<u8>,
}

impl SocketConsole {
    fn push(&mut self, buf: &[u8]) {
        for b in buf {
            if self.recent.len() == REPLAY_BYTES {
                self.recent.pop_front();
            }
            self.recent.push_back(*b);
        }
        if let Some(c) = self.client.as_mut() {
            if c.write_all(buf).is_err() {
                self.client = None;
            }
        }
    }

    fn attach(&mut self, mut stream: UnixStream) {
        let (a, b) = self.recent.as_slices();
        if stream
            .write_all(a)
            .and_then(|_| stream.write_all(b))
            .is_ok()
        {
            self.client = Some(stream);
        }
    }
}

/// Where the guest's serial output goes.
#[derive(Clone)]
pub enum SerialOut {
    Stdout,
    Sink,
    Socket(Arc<Mutex<SocketConsole>>),
    /// Collected in memory (tests and the launcher's own console handling).
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Write for SerialOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SerialOut::Stdout => io::stdout().write(buf),
            SerialOut::Sink => Ok(buf.len()),
            SerialOut::Socket(s) => {
                s.lock().expect("console lock").push(buf);
                Ok(buf.len())
            }
            SerialOut::Buffer(b) => {
                b.lock().expect("buffer lock").extend_from_slice(buf);
                Ok(buf.len())
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            SerialOut::Stdout => io::stdout().flush(),
            _ => Ok(()),
        }
    }
}

/// Signals the input side when the guest emptied the receive FIFO.
pub struct FifoDrained(Arc<EventFd>);

impl SerialEvents for FifoDrained {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {
        log::debug!("serial: lost an output byte");
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

impl SerialDevice {
    /// A UART raising `irq`, writing to `out`. Returns the device and the eventfd
    /// that fires when the receive FIFO drains (for [`SerialInput`]).
    pub fn new(irq: IrqLine, out: SerialOut) -> io::Result<(Self, Arc<EventFd>)> {
        let drained = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let serial = Serial::with_events(irq, FifoDrained(drained.clone()), out);
        Ok((Self { serial }, drained))
    }

    /// A UART in the saved `state`.
    pub fn from_state(
        irq: IrqLine,
        out: SerialOut,
        state: &SerialState,
    ) -> io::Result<(Self, Arc<EventFd>)> {
        let drained = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
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
        let serial = Serial::from_state(&s, irq, FifoDrained(drained.clone()), out)
            .map_err(|e| io::Error::other(format!("serial state: {e:?}")))?;
        Ok((Self { serial }, drained))
    }

    /// The registers and the receive FIFO.
    pub fn state(&self) -> SerialState {
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
                log::debug!("serial write: {e:?}");
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

/// Where guest input comes from.
pub enum InputSource {
    None,
    Stdin,
    /// A listening socket: one client at a time is the console.
    Socket {
        listener: UnixListener,
        console: Arc<Mutex<SocketConsole>>,
    },
}

/// Event-loop subscriber that moves input bytes into the UART.
pub struct SerialInput {
    device: Arc<Mutex<SerialDevice>>,
    source: InputSource,
    drained: Arc<EventFd>,
    /// The fd currently read from (stdin or the socket client).
    reading: Option<RawFd>,
    client: Option<UnixStream>,
    paused: bool,
}

const EV_DRAINED: u32 = 0;
const EV_INPUT: u32 = 1;
const EV_LISTENER: u32 = 2;

impl SerialInput {
    pub fn new(
        device: Arc<Mutex<SerialDevice>>,
        source: InputSource,
        drained: Arc<EventFd>,
    ) -> Self {
        Self {
            device,
            source,
            drained,
            reading: None,
            client: None,
            paused: false,
        }
    }

    fn read_input(&mut self, ops: &mut EventOps) {
        let Some(fd) = self.reading else { return };
        let cap = self.device.lock().expect("serial lock").fifo_capacity();
        if cap == 0 {
            // FIFO full: stop reading until the guest drains it.
            let _ = ops.remove(Events::with_data_raw(fd, EV_INPUT, EventSet::IN));
            self.paused = true;
            return;
        }
        let mut buf = [0u8; 64];
        let want = cap.min(buf.len());
        let n = match &mut self.client {
            Some(c) => c.read(&mut buf[..want]),
            None => io::stdin().lock().read(&mut buf[..want]),
        };
        match n {
            Ok(0) | Err(_) => {
                // EOF or error: this source is done (a socket client may reconnect).
                let _ = ops.remove(Events::with_data_raw(fd, EV_INPUT, EventSet::IN));
                self.reading = None;
                self.client = None;
            }
            Ok(n) => {
                let taken = self.device.lock().expect("serial lock").enqueue(&buf[..n]);
                debug_assert_eq!(taken, n, "input was sized to the FIFO capacity");
            }
        }
    }
}

impl MutEventSubscriber for SerialInput {
    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::with_data(
            self.drained.as_ref(),
            EV_DRAINED,
            EventSet::IN,
        ));
        match &self.source {
            InputSource::None => {}
            InputSource::Stdin => {
                let fd = io::stdin().as_raw_fd();
                if ops
                    .add(Events::with_data_raw(fd, EV_INPUT, EventSet::IN))
                    .is_ok()
                {
                    self.reading = Some(fd);
                }
            }
            InputSource::Socket { listener, .. } => {
                let _ = ops.add(Events::with_data(listener, EV_LISTENER, EventSet::IN));
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            EV_DRAINED => {
                let _ = self.drained.read();
                if self.paused {
                    if let Some(fd) = self.reading {
                        let _ = ops.add(Events::with_data_raw(fd, EV_INPUT, EventSet::IN));
                    }
                    self.paused = false;
                }
            }
            EV_INPUT => self.read_input(ops),
            EV_LISTENER => {
                if let InputSource::Socket { listener, console } = &self.source {
                    let Ok((stream, _)) = listener.accept() else {
                        return;
                    };
                    if let Some(old) = self.reading.take() {
                        let _ = ops.remove(Events::with_data_raw(old, EV_INPUT, EventSet::IN));
                    }
                    let Ok(writer) = stream.try_clone() else {
                        return;
                    };
                    console.lock().expect("console lock").attach(writer);
                    let fd = stream.as_raw_fd();
                    self.client = Some(stream);
                    self.paused = false;
                    if ops
                        .add(Events::with_data_raw(fd, EV_INPUT, EventSet::IN))
                        .is_ok()
                    {
                        self.reading = Some(fd);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let st = dev.state();
        let json = serde_json::to_string(&st).unwrap();
        let back: SerialState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st);
        let (mut r, _) =
            SerialDevice::from_state(IrqLine::new(4).unwrap(), SerialOut::Sink, &back).unwrap();
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
    fn socket_console_replays_recent_output() {
        let mut c = SocketConsole::default();
        c.push(b"early output");
        let (a, mut b) = UnixStream::pair().unwrap();
        c.attach(a);
        c.push(b"!");
        drop(c);
        let mut got = String::new();
        b.read_to_string(&mut got).unwrap();
        assert_eq!(got, "early output!");
    }
}
