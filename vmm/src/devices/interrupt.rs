//! Interrupt lines backed by irqfd: an eventfd registered with KVM for a GSI.
//! Writing the eventfd injects the interrupt without a vCPU exit or ioctl.

use std::io;
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
