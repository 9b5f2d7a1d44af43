//! Interrupt lines backed by irqfd: an eventfd registered with KVM for a GSI.
//! Writing the eventfd injects the interrupt without a vCPU exit or ioctl.
//! Also the machine's reset line ([`ResetLine`]) and the guest's power-off ([`PowerOffLine`]).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

/// An edge-triggered interrupt line into the guest.
#[derive(Clone, Debug)]
pub struct IrqLine {
    evt: Arc<EventFd>,
    gsi: u32,
}

impl IrqLine {
    /// A line whose eventfd the device manager registers with KVM (irqfd) for `gsi`.
    pub fn new(gsi: u32) -> io::Result<Self> {
        Ok(Self {
            evt: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            gsi,
        })
    }

    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }

    pub fn trigger(&self) -> io::Result<()> {
        self.evt.write(1)
    }
}

impl vm_superio::Trigger for IrqLine {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        IrqLine::trigger(self)
    }
}

/// The machine's reset line: the i8042's reset pulse and the ACPI reset register raise it.
///
/// A device raises it on the vCPU thread that wrote the request; that vCPU then stops entering
/// the guest before its next KVM_RUN (vstate/vcpu.rs), and the event loop, woken by the
/// eventfd, reboots or ends the VM and lowers the line. The hold matters: a guest does not
/// wait for its reset. Linux's keyboard reboot pulses the line twenty times in ~2 ms and then
/// falls through to a triple fault, which the VM would report as a crash whenever the event
/// loop took longer than that to stop the vCPUs (a busy host, a nested one).
#[derive(Clone, Debug)]
pub struct ResetLine {
    raised: Arc<AtomicBool>,
    evt: Arc<EventFd>,
}

impl ResetLine {
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            raised: Arc::new(AtomicBool::new(false)),
            evt: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
        })
    }

    /// Raises the line and wakes the event loop.
    pub fn raise(&self) -> io::Result<()> {
        self.raised.store(true, Ordering::Release);
        self.evt.write(1)
    }

    /// Whether a reset is requested and not yet carried out.
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Lowers the line once the reset is carried out (every vCPU paused), dropping the
    /// further pulses the same request made.
    pub fn lower(&self) {
        self.raised.store(false, Ordering::Release);
        let _ = self.evt.read();
    }

    /// The eventfd the event loop watches.
    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}

/// The guest's ACPI power-off (S5), raised by the vCPU that wrote `SLP_EN`.
///
/// Held like the [`ResetLine`]: no vCPU enters the guest again once it is raised, and the event
/// loop, woken by the eventfd, ends the VM. A guest that powered off does not run on: Linux
/// goes on after its `SLP_EN` write (it reads the sleep status, then halts or spins), and a
/// vCPU left in the guest until the event loop stops it keeps a host CPU for nothing (on a
/// busy or nested host, for as long as the event loop waits for one). Never lowered: the VM
/// ends.
#[derive(Clone, Debug)]
pub struct PowerOffLine(ResetLine);

impl PowerOffLine {
    pub fn new() -> io::Result<Self> {
        ResetLine::new().map(Self)
    }

    /// Raises the line and wakes the event loop.
    pub fn raise(&self) -> io::Result<()> {
        self.0.raise()
    }

    /// Whether the guest powered off.
    pub fn is_raised(&self) -> bool {
        self.0.is_raised()
    }

    /// The eventfd the event loop watches.
    pub fn eventfd(&self) -> &EventFd {
        self.0.eventfd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_line_raises_wakes_and_lowers() {
        let line = ResetLine::new().unwrap();
        let seen_by_vcpu = line.clone();
        assert!(!seen_by_vcpu.is_raised());
        assert!(
            line.eventfd().read().is_err(),
            "no wake-up before a request"
        );
        line.raise().unwrap();
        line.raise().unwrap();
        assert!(seen_by_vcpu.is_raised(), "a clone sees the request");
        line.lower();
        assert!(!seen_by_vcpu.is_raised());
        assert!(
            line.eventfd().read().is_err(),
            "lowering drops the pulses of the request it carried out"
        );
    }
}
