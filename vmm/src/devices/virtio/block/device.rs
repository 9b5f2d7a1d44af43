//! The virtio-blk device: features, config space, activation, and the
//! queue-processing entry point the event handler calls.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::disk::{DiskBackend, RawFile, SECTOR_SIZE};
use super::overlay::Overlay;
use super::request::{self, BlockContext, MAX_DISCARD_SECTORS, MAX_DISCARD_SEG};
use super::BlockConfig;
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::mmio::QueueSnapshot;
use crate::devices::virtio::{
    read_config_bytes, ActivateError, VirtioDevice, VirtioError, VirtioInterrupt, TYPE_BLOCK,
    VIRTIO_F_VERSION_1,
};
use crate::vstate::memory::GuestMemoryMmap;

/// Queue size offered to the driver.
pub const QUEUE_SIZE: u16 = 256;

pub const VIRTIO_BLK_F_SEG_MAX: u32 = 2;
pub const VIRTIO_BLK_F_RO: u32 = 5;
pub const VIRTIO_BLK_F_BLK_SIZE: u32 = 6;
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;
pub const VIRTIO_BLK_F_DISCARD: u32 = 13;
pub const VIRTIO_BLK_F_WRITE_ZEROES: u32 = 14;

/// Size of the config space we expose (`struct virtio_blk_config` up to
/// `write_zeroes_may_unmap` + padding).
const CONFIG_LEN: usize = 60;

/// Plain-data device state (for snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockDeviceState {
    pub avail_features: u64,
    pub acked_features: u64,
    pub capacity: u64,
    pub read_only: bool,
    pub id: [u8; 20],
    pub needs_reset: bool,
}

/// A virtio-blk device over any [`DiskBackend`].
pub struct BlockDevice {
    disk: Box<dyn DiskBackend>,
    ctx: BlockContext,
    avail_features: u64,
    acked_features: u64,
    config: [u8; CONFIG_LEN],
    queue_sizes: [u16; 1],
    queue_evts: Vec<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
    active: Option<(GuestMemoryMmap, Queue)>,
    broken: bool,
}

impl BlockDevice {
    /// Open the backend `cfg` names (raw file, read-only file, or base +
    /// overlay) and build the device.
    pub fn from_config(cfg: &BlockConfig, irq: IrqLine) -> Result<Self, VirtioError> {
        let disk: Box<dyn DiskBackend> = match &cfg.overlay {
            Some(o) => Box::new(Overlay::open(&cfg.path, o)?),
            None => Box::new(RawFile::open(&cfg.path, cfg.read_only)?),
        };
        Self::new(disk, cfg.id_bytes(), irq)
    }

    /// A device over `disk` answering GET_ID with `id`.
    pub fn new(
        disk: Box<dyn DiskBackend>,
        id: [u8; 20],
        irq: IrqLine,
    ) -> Result<Self, VirtioError> {
        let ro = disk.read_only();
        let mut f = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_BLK_F_BLK_SIZE)
            | (1 << VIRTIO_BLK_F_FLUSH);
        if ro {
            f |= 1 << VIRTIO_BLK_F_RO;
        } else {
            f |= (1 << VIRTIO_BLK_F_DISCARD) | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
        }
        let mut c = [0u8; CONFIG_LEN];
        c[0..8].copy_from_slice(&(disk.capacity() / SECTOR_SIZE).to_le_bytes());
        c[12..16].copy_from_slice(&u32::from(QUEUE_SIZE - 2).to_le_bytes()); // seg_max
        c[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes()); // blk_size
        c[34..36].copy_from_slice(&1u16.to_le_bytes()); // num_queues
        c[36..40].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
        c[40..44].copy_from_slice(&MAX_DISCARD_SEG.to_le_bytes());
        c[44..48].copy_from_slice(&1u32.to_le_bytes()); // discard_sector_alignment
        c[48..52].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
        c[52..56].copy_from_slice(&MAX_DISCARD_SEG.to_le_bytes());
        c[56] = 1; // write_zeroes_may_unmap
        Ok(Self {
            disk,
            ctx: BlockContext { id },
            avail_features: f,
            acked_features: 0,
            config: c,
            queue_sizes: [QUEUE_SIZE],
            queue_evts: vec![EventFd::new(libc::EFD_NONBLOCK).map_err(VirtioError::EventFd)?],
            interrupt: Arc::new(VirtioInterrupt::new(irq)),
            active: None,
            broken: false,
        })
    }

    /// Plain-data state.
    pub fn state(&self) -> BlockDeviceState {
        BlockDeviceState {
            avail_features: self.avail_features,
            acked_features: self.acked_features,
            capacity: self.disk.capacity(),
            read_only: self.disk.read_only(),
            id: self.ctx.id,
            needs_reset: self.broken,
        }
    }

    /// Drain the request queue (event-loop thread). Signals the guest when
    /// chains completed; marks the device NEEDS_RESET on fatal guest errors.
    pub fn process_queue(&mut self) {
        if self.broken {
            return;
        }
        let Some((mem, q)) = self.active.as_mut() else {
            return;
        };
        let out = request::process_queue(q, mem, self.disk.as_mut(), &self.ctx);
        if out.used > 0 && q.needs_notification(mem).unwrap_or(true) {
            self.interrupt.signal_used_queue();
        }
        if out.fatal.is_some() {
            self.broken = true;
            self.interrupt.set_needs_reset();
        }
    }
}

impl VirtioDevice for BlockDevice {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }
    fn avail_features(&self) -> u64 {
        self.avail_features
    }
    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features;
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        mut queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount {
                expected: 1,
                got: queues.len(),
            });
        }
        let q = queues.remove(0);
        self.active = Some((mem, q));
        self.broken = false;
        // Requests queued before DRIVER_OK (not allowed, but harmless).
        self.queue_evts[0]
            .write(1)
            .map_err(ActivateError::EventFd)?;
        Ok(())
    }
    fn reset(&mut self) {
        self.active = None;
        self.broken = false;
        self.acked_features = 0;
    }
    fn is_activated(&self) -> bool {
        self.active.is_some()
    }
    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }
    fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }
    fn live_queues(&self) -> Option<Vec<QueueSnapshot>> {
        self.active
            .as_ref()
            .map(|(_, q)| vec![QueueSnapshot::from(q)])
    }
}

impl BlockDevice {
    /// FLUSH the backend (snapshots: every completed write is on disk).
    pub fn flush_disk(&mut self) -> Result<(), super::DiskError> {
        self.disk.flush()
    }

    pub(super) fn disk_mut(&mut self) -> &mut dyn DiskBackend {
        self.disk.as_mut()
    }

    pub(super) fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }

    /// The queue the device is processing, if active (tests, benches).
    pub fn active_queue(&self) -> Option<&Queue> {
        self.active.as_ref().map(|(_, q)| q)
    }

    /// Whether a fatal guest error stopped the device.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Used-ring position (tests).
    pub fn next_used(&self) -> Option<u16> {
        self.active_queue().map(|q| q.next_used())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block::disk::MemDisk;

    fn cfg_u32(d: &BlockDevice, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read_config(off, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn features_and_config_space() {
        let d = BlockDevice::new(
            Box::new(MemDisk::new(1 << 20, false)),
            [0; 20],
            IrqLine::new(5).unwrap(),
        )
        .unwrap();
        let f = d.avail_features();
        for b in [
            VIRTIO_F_VERSION_1,
            VIRTIO_BLK_F_FLUSH,
            VIRTIO_BLK_F_DISCARD,
            VIRTIO_BLK_F_WRITE_ZEROES,
            VIRTIO_BLK_F_SEG_MAX,
        ] {
            assert_ne!(f & (1 << b), 0, "bit {b}");
        }
        assert_eq!(f & (1 << VIRTIO_BLK_F_RO), 0);
        let mut cap = [0u8; 8];
        d.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), 2048);
        assert_eq!(cfg_u32(&d, 12), 254); // seg_max
        assert_eq!(cfg_u32(&d, 40), MAX_DISCARD_SEG);
        // Reads past the config space are zero, never a panic.
        assert_eq!(cfg_u32(&d, 0xf00), 0);
        assert_eq!(cfg_u32(&d, u64::MAX - 1), 0);
        let ro = BlockDevice::new(
            Box::new(MemDisk::new(4096, true)),
            [0; 20],
            IrqLine::new(5).unwrap(),
        )
        .unwrap();
        let f = ro.avail_features();
        assert_ne!(f & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(f & (1 << VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(f & (1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
    }
}
