//! Helpers shared by the virtio unit tests.

use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::{ActivateError, VirtioDevice, VirtioInterrupt};
use crate::devices::interrupt::IrqLine;
use crate::vstate::memory::GuestMemoryMmap;

/// 16 MiB of guest memory at 0.
pub fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap()
}

/// A device that records what the transport does to it.
pub struct DummyDevice {
    pub sizes: Vec<u16>,
    pub acked: u64,
    pub active: bool,
    pub activated_queues: Vec<Queue>,
    pub config: Vec<u8>,
    pub evts: Vec<EventFd>,
    pub interrupt: Arc<VirtioInterrupt>,
}

impl DummyDevice {
    pub fn new(sizes: &[u16]) -> Self {
        Self {
            sizes: sizes.to_vec(),
            acked: 0,
            active: false,
            activated_queues: Vec::new(),
            config: (0..16).collect(),
            evts: sizes
                .iter()
                .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
                .collect(),
            interrupt: Arc::new(VirtioInterrupt::new(IrqLine::new(5).unwrap())),
        }
    }
}

impl VirtioDevice for DummyDevice {
    fn device_type(&self) -> u32 {
        42
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }
    fn avail_features(&self) -> u64 {
        (1 << 32) | (1 << 3)
    }
    fn set_acked_features(&mut self, features: u64) {
        self.acked = features;
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.config, offset, data);
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let o = offset as usize;
        self.config[o..o + data.len()].copy_from_slice(data);
    }
    fn activate(&mut self, _mem: GuestMemoryMmap, queues: Vec<Queue>) -> Result<(), ActivateError> {
        self.active = true;
        self.activated_queues = queues;
        Ok(())
    }
    fn reset(&mut self) {
        self.active = false;
    }
    fn is_activated(&self) -> bool {
        self.active
    }
    fn queue_events(&self) -> &[EventFd] {
        &self.evts
    }
    fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }
}

/// A file path under the temp dir, removed on drop.
pub struct TempPath(pub std::path::PathBuf);

impl TempPath {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p =
            std::env::temp_dir().join(format!("microvirt-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A temp file of `len` bytes of `fill`.
pub fn temp_image(len: usize, fill: u8) -> TempPath {
    let p = TempPath::new("img");
    std::fs::write(&p.0, vec![fill; len]).unwrap();
    p
}

pub use super::testing::*;
