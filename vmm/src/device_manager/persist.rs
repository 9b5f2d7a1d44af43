//! What the device manager saves of the devices and how it restores them ([`DeviceStates`]):
//! the serial port, the i8042 and the ACPI registers (each its own `Persist`), and per virtio
//! device its MMIO slot, the transport's state and the device's own, the device re-attached at
//! the same slot on restore. The serial port, i8042 and ACPI registers are rebuilt from their
//! states with the other legacy devices (`builder/mod.rs`, `legacy_devices`).

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::attach::Devices;
use super::attach::{
    attach_device, block_name, net_name, AttachContext, AttachError, AttachedDevice, RNG_NAME,
};
use super::mmio::MmioSlot;
use crate::devices::acpi::AcpiPmState;
use crate::devices::interrupt::IrqLine;
use crate::devices::legacy::i8042::I8042State;
use crate::devices::legacy::serial::SerialState;
use crate::devices::virtio::block::persist::{BlockArgs, BlockRestoreError, BlockState};
use crate::devices::virtio::block::{BlockConfig, BlockDevice, IoThreadOptions};
use crate::devices::virtio::mmio::MmioTransportState;
use crate::devices::virtio::net::persist::{NetArgs, NetRestoreError, NetState};
use crate::devices::virtio::net::tap::Tap;
use crate::devices::virtio::net::{NetConfig, NetDevice};
use crate::devices::virtio::rng::persist::{RngRestoreError, RngState};
use crate::devices::virtio::rng::RngDevice;
use crate::devices::virtio::VirtioError;
use crate::persist::Persist;

/// Every device's state in a snapshot: the legacy devices, the virtio devices in slot order
/// and the ACPI registers. In the state file its fields sit at the payload's top level
/// (`snapshot/state.rs` flattens it into `MicrovmState`) under the names format 1.0 gave them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceStates {
    pub serial: SerialState,
    pub i8042: I8042State,
    /// virtio devices in slot order.
    #[serde(rename = "devices")]
    pub virtio: Vec<VirtioDeviceState>,
    /// The ACPI registers' state (events the guest has not read), when the VM has ACPI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acpi_pm: Option<AcpiPmState>,
}

impl Devices {
    /// Saves every device; the vCPUs are paused and the virtio devices quiesced. A disk with a
    /// copy-on-write overlay writes it to the file `overlay` gives for its index, and its state
    /// records the name given with it. Returns the states and the overlay bytes written.
    pub fn save<'f>(
        &self,
        overlay: impl Fn(usize) -> Option<(&'f File, String)>,
    ) -> Result<(DeviceStates, u64), PersistError> {
        let mut overlay_bytes = 0;
        let mut virtio = Vec::with_capacity(self.virtio.len());
        for (i, d) in self.virtio.iter().enumerate() {
            let overlay_file = if d.has_overlay() {
                let (out, name) = overlay(i).ok_or(PersistError::NoOverlayFile(i))?;
                overlay_bytes += d.save_overlay(out)?;
                Some(name)
            } else {
                None
            };
            virtio.push(d.save(overlay_file));
        }
        let states = DeviceStates {
            serial: self.serial.lock().expect("serial lock").save(),
            i8042: self.i8042.lock().expect("i8042 lock").save(),
            virtio,
            acpi_pm: self
                .acpi_pm
                .as_ref()
                .map(|pm| pm.lock().expect("ACPI lock").save()),
        };
        Ok((states, overlay_bytes))
    }
}

/// Which configuration each virtio device of a snapshot is restored with: the snapshot's, or
/// a replacement (`block` for a disk, `net` for a NIC).
pub struct RestorePlan<'a> {
    configs: Vec<(Option<&'a BlockConfig>, Option<&'a NetConfig>)>,
}

/// Why a restore's replacements do not fit the snapshot.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{disks} disk and {nets} NIC replacements given; the snapshot has {n_disks} disk(s) and {n_nets} NIC(s)")]
    Count {
        disks: usize,
        nets: usize,
        n_disks: usize,
        n_nets: usize,
    },
    #[error("device {index}: {source}")]
    Device { index: usize, source: PersistError },
}

impl DeviceStates {
    /// Gives the snapshot's disks and NICs, in slot order, the replacements `disks` and `nets`
    /// (devices without one keep the snapshot's configuration); every disk image must exist.
    /// Checked before anything of the VM is built.
    pub fn plan<'a>(
        &self,
        disks: &'a [BlockConfig],
        nets: &'a [NetConfig],
    ) -> Result<RestorePlan<'a>, PlanError> {
        let (n_disks, n_nets) = self.virtio.iter().fold((0, 0), |(b, n), d| match d.device {
            DeviceState::Block(_) => (b + 1, n),
            DeviceState::Net(_) => (b, n + 1),
            DeviceState::Rng(_) => (b, n),
        });
        if disks.len() > n_disks || nets.len() > n_nets {
            return Err(PlanError::Count {
                disks: disks.len(),
                nets: nets.len(),
                n_disks,
                n_nets,
            });
        }
        let mut configs = Vec::with_capacity(self.virtio.len());
        let (mut bi, mut ni) = (0, 0);
        for (i, d) in self.virtio.iter().enumerate() {
            match &d.device {
                DeviceState::Block(b) => {
                    let over = disks.get(bi);
                    bi += 1;
                    let path = &over.unwrap_or(&b.config).path;
                    if let Err(e) = std::fs::metadata(path) {
                        return Err(PlanError::Device {
                            index: i,
                            source: PersistError::Virtio(VirtioError::OpenImage {
                                path: path.display().to_string(),
                                source: e,
                            }),
                        });
                    }
                    configs.push((over, None));
                }
                DeviceState::Net(_) => {
                    configs.push((None, nets.get(ni)));
                    ni += 1;
                }
                DeviceState::Rng(_) => configs.push((None, None)),
            }
        }
        Ok(RestorePlan { configs })
    }

    /// Re-attaches the virtio devices in slot order, each at its saved slot, configured as
    /// `plan` says. `saved_overlay` gives the snapshot's copy of a disk's overlay; a disk's I/O
    /// thread starts as `block_io` says; a NIC whose TAP is among `taps` takes it. Overlay files
    /// this creates are added to `created` (a failed restore removes them). An error names the
    /// device's index.
    pub fn restore_virtio<'f>(
        &self,
        plan: RestorePlan<'_>,
        ctx: &mut AttachContext<'_>,
        saved_overlay: impl Fn(usize) -> Option<&'f File>,
        block_io: impl Fn(usize) -> IoThreadOptions,
        taps: &mut Vec<Tap>,
        created: &mut Vec<PathBuf>,
    ) -> Result<Vec<AttachedDevice>, (usize, PersistError)> {
        let mut attached = Vec::with_capacity(self.virtio.len());
        for (i, (d, (block, net))) in self.virtio.iter().zip(plan.configs).enumerate() {
            let target_overlay = match &d.device {
                DeviceState::Block(b) => block.unwrap_or(&b.config).overlay.clone(),
                DeviceState::Net(_) | DeviceState::Rng(_) => None,
            };
            if let Some(o) = target_overlay.filter(|o| !o.exists()) {
                created.push(o);
            }
            let a = restore_device(ctx, i, d, block, saved_overlay(i), net, block_io(i), taps)
                .map_err(|e| (i, e))?;
            attached.push(a);
        }
        Ok(attached)
    }
}

/// One device's kind-specific state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum DeviceState {
    Block(BlockState),
    Net(NetState),
    Rng(RngState),
}

/// One virtio device in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioDeviceState {
    pub slot: MmioSlot,
    pub transport: MmioTransportState,
    pub device: DeviceState,
}

impl AttachedDevice {
    /// The device's state. `overlay_file` names the snapshot's copy of a disk overlay.
    pub fn save(&self, overlay_file: Option<String>) -> VirtioDeviceState {
        let transport = self.transport().lock().expect("transport lock").save();
        let device = match self {
            AttachedDevice::Block { config, device, .. } => DeviceState::Block(BlockState {
                config: config.clone(),
                device: device.lock().expect("virtio-blk lock").save(),
                overlay_file,
            }),
            AttachedDevice::Net { config, device, .. } => DeviceState::Net(NetState {
                config: config.clone(),
                saved: device.lock().expect("virtio-net lock").save(),
            }),
            AttachedDevice::Rng { device, .. } => {
                DeviceState::Rng(device.lock().expect("virtio-rng lock").save())
            }
        };
        VirtioDeviceState {
            slot: self.slot(),
            transport,
            device,
        }
    }

    /// A disk with a copy-on-write overlay: writes the overlay to `out`.
    pub fn save_overlay(&self, out: &File) -> Result<u64, PersistError> {
        match self {
            AttachedDevice::Block { config, device, .. } => device
                .lock()
                .expect("virtio-blk lock")
                .save_overlay(out)
                .map_err(|source| PersistError::SaveOverlay {
                    path: config.path.display().to_string(),
                    source,
                }),
            AttachedDevice::Net { .. } | AttachedDevice::Rng { .. } => Err(PersistError::Virtio(
                VirtioError::Disk(crate::devices::virtio::block::DiskError::NotAnOverlay),
            )),
        }
    }
}

/// Re-creates device `index` of a snapshot in `state`, at the same slot, with its saved
/// configuration or the override (`block` for a disk, `net` for a NIC). `saved_overlay` is the
/// snapshot's copy of a disk's overlay; a disk's I/O thread starts as `block_io` says.
/// A NIC whose TAP is among `taps` (opened by the embedder) takes it.
#[allow(clippy::too_many_arguments)]
fn restore_device(
    ctx: &mut AttachContext<'_>,
    index: usize,
    state: &VirtioDeviceState,
    block: Option<&BlockConfig>,
    saved_overlay: Option<&File>,
    net: Option<&NetConfig>,
    block_io: IoThreadOptions,
    taps: &mut Vec<Tap>,
) -> Result<AttachedDevice, PersistError> {
    let slot = ctx.mgr.peek_next().map_err(AttachError::Slot)?;
    if slot != state.slot {
        return Err(PersistError::Slot {
            index,
            saved: state.slot.addr,
            saved_irq: state.slot.irq,
            here: slot.addr,
            here_irq: slot.irq,
        });
    }
    let irq = IrqLine::new(slot.irq).map_err(VirtioError::EventFd)?;
    match &state.device {
        DeviceState::Block(b) => {
            let cfg = block.unwrap_or(&b.config);
            if b.config.overlay.is_some() {
                if cfg.overlay.is_none() {
                    return Err(PersistError::OverlayRequired(index));
                }
                if saved_overlay.is_none() {
                    return Err(PersistError::NoOverlayCopy(index));
                }
            }
            let args = BlockArgs {
                config: cfg,
                saved_overlay,
                irq,
                io: block_io,
            };
            let dev = BlockDevice::restore(args, &b.device)?;
            let a = attach_device(
                ctx,
                Arc::new(Mutex::new(dev)),
                slot,
                block_name(cfg),
                Some(&state.transport),
            )?;
            Ok(AttachedDevice::Block {
                slot,
                config: cfg.clone(),
                transport: a.transport,
                device: a.device,
            })
        }
        DeviceState::Net(n) => {
            let cfg = net.unwrap_or(&n.config);
            let opened = taps
                .iter()
                .position(|t| t.name() == cfg.tap)
                .map(|i| taps.swap_remove(i));
            let args = NetArgs {
                config: cfg,
                irq,
                opened,
            };
            let dev = NetDevice::restore(args, &n.saved)?;
            let a = attach_device(
                ctx,
                Arc::new(Mutex::new(dev)),
                slot,
                net_name(cfg),
                Some(&state.transport),
            )?;
            Ok(AttachedDevice::Net {
                slot,
                config: NetConfig {
                    tap: cfg.tap.clone(),
                    mac: n.saved.device.mac,
                },
                transport: a.transport,
                device: a.device,
            })
        }
        DeviceState::Rng(r) => {
            let dev = RngDevice::restore(irq, r)?;
            let a = attach_device(
                ctx,
                Arc::new(Mutex::new(dev)),
                slot,
                RNG_NAME.into(),
                Some(&state.transport),
            )?;
            Ok(AttachedDevice::Rng {
                slot,
                transport: a.transport,
                device: a.device,
            })
        }
    }
}

/// Why a device could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Block(#[from] BlockRestoreError),
    #[error(transparent)]
    Net(#[from] NetRestoreError),
    #[error(transparent)]
    Rng(#[from] RngRestoreError),
    #[error("device {index}: the snapshot has it at {saved:#x}/GSI {saved_irq}, this VM at {here:#x}/GSI {here_irq}")]
    Slot {
        index: usize,
        saved: u64,
        saved_irq: u32,
        here: u64,
        here_irq: u32,
    },
    #[error("disk {0}: the snapshot has no copy of its overlay")]
    NoOverlayCopy(usize),
    #[error(
        "disk {0} wrote to a copy-on-write overlay: the restored disk needs one too (overlay=PATH)"
    )]
    OverlayRequired(usize),
    #[error("no file for the overlay of device {0}")]
    NoOverlayFile(usize),
    #[error("saving the overlay of {path}: {source}")]
    SaveOverlay { path: String, source: VirtioError },
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, RawFd};

    use vmm_sys_util::eventfd::EventFd;

    use super::*;
    use crate::devices::acpi::{AcpiPmArgs, AcpiPmDevice};
    use crate::devices::bus::BusDevice;
    use crate::devices::interrupt::ResetLine;
    use crate::devices::legacy::i8042::{I8042Args, I8042Device};
    use crate::devices::legacy::serial::{SerialArgs, SerialDevice, SerialOut};
    use crate::devices::virtio::block::device::BlockDeviceState;
    use crate::devices::virtio::mmio::{MmioTransport, TransportArgs};
    use crate::devices::virtio::net::device::{NetBackend, NetDeviceState};
    use crate::devices::virtio::net::frames::NetStats;
    use crate::devices::virtio::net::persist::NetSaved;
    use crate::devices::virtio::net::tap::FrameIo;
    use crate::devices::virtio::net::MacAddr;
    use crate::devices::virtio::rng::device::RngDeviceState;
    use crate::devices::virtio::test_utils::{mem, temp_image, DummyDevice};
    use crate::devices::virtio::{VirtioDevice, VIRTIO_F_VERSION_1};

    fn irq() -> IrqLine {
        IrqLine::new(5).unwrap()
    }

    /// Saves `state` through JSON, as a state file would.
    fn through_json<T: Serialize + serde::de::DeserializeOwned>(state: &T) -> T {
        serde_json::from_slice(&serde_json::to_vec(state).unwrap()).unwrap()
    }

    /// A NIC backend without a TAP: nothing to read, every frame sent.
    struct NoTap(EventFd);

    impl FrameIo for NoTap {
        fn read_frame(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::WouldBlock.into())
        }
        fn write_frame(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
    }

    impl NetBackend for NoTap {
        fn fd(&self) -> RawFd {
            self.0.as_raw_fd()
        }
        fn supported_offloads(&self) -> u32 {
            0
        }
        fn set_offloads(&mut self, _: u32) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn every_device_round_trips_through_its_persist() {
        // Serial: a scratch register and input the guest has not read.
        let (mut uart, _) = SerialDevice::new(irq(), SerialOut::Sink).unwrap();
        uart.write(7, &[0x5a]);
        let st = through_json(&SerialState {
            in_buffer: b"ls\n".to_vec(),
            ..uart.save()
        });
        assert_eq!(st.scratch, 0x5a);
        let args = SerialArgs {
            irq: irq(),
            out: SerialOut::Sink,
        };
        assert_eq!(SerialDevice::restore(args, &st).unwrap().save(), st);
        assert_eq!(st.in_buffer, b"ls\n");

        // i8042: a keyboard command's acknowledgement waiting.
        let reset = ResetLine::new().unwrap();
        let mut kbd = I8042Device::new(reset.clone(), irq());
        kbd.write(0, &[0xed]);
        let st = through_json(&kbd.save());
        assert!(!st.buf.is_empty());
        let args = I8042Args {
            reset: reset.clone(),
            irq: irq(),
        };
        let Ok(back) = I8042Device::restore(args, &st);
        assert_eq!(back.save(), st);

        // ACPI registers: a power button press the guest has not read.
        let off = crate::devices::interrupt::PowerOffLine::new().unwrap();
        let mut pm = AcpiPmDevice::new(irq(), reset.clone(), off.clone());
        pm.press_power_button().unwrap();
        let st = through_json(&pm.save());
        assert_ne!(st.ged_pending, 0);
        let args = AcpiPmArgs {
            ged_irq: irq(),
            reset,
            poweroff: off,
        };
        let Ok(back) = AcpiPmDevice::restore(args, &st);
        assert_eq!(back.save(), st);

        // virtio-blk: acked features and the broken flag.
        let img = temp_image(1 << 20, 0);
        let cfg = BlockConfig {
            path: img.0.clone(),
            read_only: false,
            id: Some("disk".into()),
            overlay: None,
        };
        let mut disk = BlockDevice::from_config(&cfg, irq(), IoThreadOptions::default()).unwrap();
        disk.set_acked_features(1 << VIRTIO_F_VERSION_1);
        let st = through_json(&disk.save());
        assert_eq!(st.capacity, 1 << 20);
        drop(disk); // its lock on the image
        let args = BlockArgs {
            config: &cfg,
            saved_overlay: None,
            irq: irq(),
            io: IoThreadOptions::default(),
        };
        assert_eq!(BlockDevice::restore(args, &st).unwrap().save(), st);

        // virtio-net (its device half: the TAP is the new VM's): MAC, counters, a pending frame.
        let mac = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        let backend = || Box::new(NoTap(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
        let mut nic = NetDevice::new(backend(), Some(mac), irq()).unwrap();
        let offered = nic.avail_features();
        nic.set_acked_features(offered);
        let saved = nic.save();
        let st = through_json(&NetSaved {
            device: NetDeviceState {
                stats: NetStats {
                    rx_frames: 3,
                    tx_bytes: 1500,
                    ..NetStats::default()
                },
                ..saved.device
            },
            rx_pending: Some(vec![0xab; 60]),
        });
        let back = NetDevice::restore_on(backend(), "no TAP", irq(), &st).unwrap();
        assert_eq!(back.save(), st);
        assert_eq!(back.save().device.mac, Some(mac));

        // virtio-rng: the broken flag.
        let st = through_json(&RngState {
            device: RngDeviceState {
                acked_features: 1 << VIRTIO_F_VERSION_1,
                needs_reset: true,
            },
        });
        assert_eq!(RngDevice::restore(irq(), &st).unwrap().save(), st);

        // The transport: its registers in front of a device.
        let dev = Arc::new(Mutex::new(DummyDevice::new(&[8])));
        let t = MmioTransport::new(mem(), dev.clone());
        let st = through_json(&t.save());
        let args = TransportArgs {
            mem: mem(),
            device: dev,
        };
        assert_eq!(MmioTransport::restore(args, &st).unwrap().save(), st);
    }

    #[test]
    fn device_errors_keep_their_messages() {
        // Acked features the restored backend does not offer: the device's own error, worded
        // as before the split.
        let st = RngState {
            device: RngDeviceState {
                acked_features: 1 << 3,
                needs_reset: false,
            },
        };
        let e = PersistError::from(RngDevice::restore(irq(), &st).err().unwrap());
        assert_eq!(
            e.to_string(),
            format!(
                "virtio-rng does not offer features 0x8 the guest acked (offers {:#x})",
                1u64 << VIRTIO_F_VERSION_1
            )
        );
        let img = temp_image(4096, 0);
        let cfg = BlockConfig {
            path: img.0.clone(),
            read_only: false,
            id: None,
            overlay: None,
        };
        let disk = BlockDevice::from_config(&cfg, irq(), IoThreadOptions::default()).unwrap();
        let st = BlockDeviceState {
            capacity: 8192,
            ..disk.save()
        };
        drop(disk); // its lock on the image
        let args = BlockArgs {
            config: &cfg,
            saved_overlay: None,
            irq: irq(),
            io: IoThreadOptions::default(),
        };
        let e = PersistError::from(BlockDevice::restore(args, &st).err().unwrap());
        assert_eq!(
            e.to_string(),
            format!(
                "disk {} has 4096 bytes, the snapshot's disk had 8192",
                img.0.display()
            )
        );
    }

    #[test]
    fn the_plan_counts_replacements_and_wants_every_disk_image() {
        let block = |path: &str| VirtioDeviceState {
            slot: MmioSlot {
                addr: 0xd000_0000,
                len: 0x1000,
                irq: 5,
            },
            transport: MmioTransportState::default(),
            device: DeviceState::Block(BlockState {
                config: BlockConfig {
                    path: path.into(),
                    read_only: true,
                    id: None,
                    overlay: None,
                },
                device: BlockDeviceState {
                    avail_features: 0,
                    acked_features: 0,
                    capacity: 4096,
                    read_only: true,
                    id: [0; 20],
                    needs_reset: false,
                },
                overlay_file: None,
            }),
        };
        let img = temp_image(4096, 0);
        let states = DeviceStates {
            serial: {
                let (uart, _) = SerialDevice::new(irq(), SerialOut::Sink).unwrap();
                uart.save()
            },
            i8042: I8042Device::new(ResetLine::new().unwrap(), irq()).save(),
            virtio: vec![block("/nonexistent/microvirt-disk.img")],
            acpi_pm: None,
        };
        let e = states.plan(&[], &[]).err().unwrap();
        assert_eq!(
            e.to_string(),
            "device 0: cannot open disk image /nonexistent/microvirt-disk.img: No such file or directory (os error 2)"
        );
        let over = BlockConfig {
            path: img.0.clone(),
            read_only: true,
            id: None,
            overlay: None,
        };
        let plan = states.plan(std::slice::from_ref(&over), &[]).unwrap();
        assert_eq!(plan.configs, vec![(Some(&over), None)]);
        let nic = NetConfig {
            tap: "tap0".into(),
            mac: None,
        };
        let e = states.plan(&[], &[nic]).err().unwrap();
        assert_eq!(
            e.to_string(),
            "0 disk and 1 NIC replacements given; the snapshot has 1 disk(s) and 0 NIC(s)"
        );
    }
}
