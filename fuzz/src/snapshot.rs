//! `snapshot_state`: a snapshot's state file (`vmstate`) as restore reads it, and the parts of a
//! restore that do not need KVM.
//!
//! The input is a mode byte, a TSC delta and a body. The body is either the whole file, or a
//! payload the harness wraps in a valid header (so mutations reach the JSON and the checks after
//! it instead of dying at the checksum). It is written into a real snapshot directory (with a
//! sparse memory file of the size the payload asks for and empty overlay copies, so opening can
//! get past those checks) and [`LoadedSnapshot::open`] reads it. Checked:
//! - `format::decode(format::encode(p))` gives back `p`; whatever `decode` accepts has the magic,
//!   the supported major, the exact length and the checksum of its payload;
//! - opening never panics and every error is one line; what it accepts decoded, parsed as the
//!   harness parses it, has one state per vCPU with ids in order and memory regions that are the
//!   VM's own for its RAM size;
//! - then, as a restore would: the MSR list for each vCPU (same MSRs, TSC advanced by the delta),
//!   the UART and the i8042 from their saved state (reading back what was saved, the i8042's
//!   buffer bounded), and every virtio device (disk, NIC, entropy) re-created over a scratch disk, a fake TAP or getrandom with
//!   its transport restored in guest memory; a restored transport reports exactly the saved
//!   registers, and processing its queues (rings at whatever the file says) must not panic.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vmm::device_manager::persist::{DeviceState, DeviceStates, VirtioDeviceState};
use vmm::devices::interrupt::{IrqLine, ResetLine};
use vmm::devices::legacy::i8042::{I8042Args, I8042Device};
use vmm::devices::legacy::serial::{SerialArgs, SerialDevice, SerialOut};
use vmm::devices::virtio::block::device::IoThreadOptions;
use vmm::devices::virtio::block::persist::BlockArgs;
use vmm::devices::virtio::block::{BlockConfig, BlockDevice};
use vmm::devices::virtio::mmio::{MmioTransport, TransportArgs};
use vmm::devices::virtio::net::NetDevice;
use vmm::devices::virtio::rng::RngDevice;
use vmm::devices::virtio::VirtioDevice;
use vmm::persist::Persist;
use vmm::snapshot::format;
use vmm::snapshot::state::MicrovmState;
use vmm::snapshot::LoadedSnapshot;
use vmm::vstate::memory::GuestMemoryMmap;
use vmm::vstate::persist::{restore_msrs, tsc_ticks};

use crate::backend::pair;
use crate::driver::guest_memory;
use crate::input::Input;
use crate::scratch;

/// The memory file is sparse; beyond this the harness does not bother (open then fails on
/// the size, as it should for such a file).
const MAX_MEMORY_FILE: u64 = 1 << 44;

pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let tsc_delta = inp.u64();
    let body = inp.rest();
    let file = if mode & 1 == 1 {
        format::encode(body)
    } else {
        body.to_vec()
    };
    let decoded = format::decode(&file);
    if mode & 1 == 1 {
        assert_eq!(
            decoded,
            Ok((format::CURRENT, body)),
            "decode(encode(payload)) is not the payload"
        );
    }
    if let Ok((v, payload)) = &decoded {
        assert_eq!(v.major, format::FORMAT_MAJOR, "decoded another major");
        assert_eq!(&file[..8], format::MAGIC);
        assert_eq!(file.len(), format::HEADER_LEN + payload.len(), "length");
        let stored = u64::from_le_bytes(file[24..32].try_into().expect("8 bytes"));
        assert_eq!(stored, format::crc64(payload), "checksum");
    }
    let parsed: Option<MicrovmState> = decoded
        .as_ref()
        .ok()
        .and_then(|(_, p)| serde_json::from_slice(p).ok());
    trace!(
        "mode {mode:#x}, {} bytes, decoded {:?}, parsed {}",
        file.len(),
        decoded.as_ref().map(|d| d.0),
        parsed.is_some()
    );

    let dir = scratch::dir(0).join(scratch::file_name("snapshot"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir(&dir).expect("snapshot directory");
    fs::write(dir.join("vmstate"), &file).expect("write vmstate");
    let memory = File::create(dir.join("memory")).expect("memory file");
    if let Some(s) = &parsed {
        let len = s
            .machine
            .memory_regions
            .iter()
            .fold(0u64, |a, r| a.saturating_add(r.1));
        memory
            .set_len(len.min(MAX_MEMORY_FILE))
            .expect("sparse memory file");
        for d in &s.devices.virtio {
            if let DeviceState::Block(b) = &d.device {
                if let Some(name) = b.overlay_file.as_deref().filter(|n| plain_name(n)) {
                    File::create(dir.join(name)).expect("overlay copy");
                }
            }
        }
    }
    drop(memory);

    match LoadedSnapshot::open(&dir) {
        Err(e) => {
            let msg = e.to_string();
            trace!("refused: {msg}");
            assert!(!msg.contains('\n'), "a multi-line error: {msg:?}");
        }
        Ok(l) => {
            let (version, _) = decoded.expect("open accepted a file decode refuses");
            assert_eq!(l.version, version);
            let state = parsed.expect("open accepted a payload serde_json refuses");
            assert_eq!(l.state, state, "open parsed another state");
            check_loaded(&dir, &l);
            restore(&l.state, tsc_delta, mode);
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

/// A file name the harness may create inside the snapshot directory.
fn plain_name(n: &str) -> bool {
    !n.is_empty() && n.len() < 200 && !n.contains(['/', '\0']) && n != "." && n != ".."
}

fn check_loaded(dir: &Path, l: &LoadedSnapshot) {
    let s = &l.state;
    let m = &s.machine;
    assert!(m.vcpus >= 1 && usize::from(m.vcpus) == s.vcpus.len());
    for (i, v) in s.vcpus.iter().enumerate() {
        assert_eq!(usize::from(v.id), i, "vCPU ids in order");
    }
    let expected: Vec<(u64, u64)> = vmm::arch::x86_64::boot::memory_regions(m.mem_mib << 20)
        .iter()
        .map(|(a, len)| (a.0, *len as u64))
        .collect();
    assert_eq!(
        m.memory_regions, expected,
        "memory regions for {} MiB",
        m.mem_mib
    );
    let total: u64 = expected.iter().map(|r| r.1).sum();
    assert_eq!(l.memory.metadata().expect("memory file").len(), total);
    for (i, _) in &l.overlays {
        let Some(DeviceState::Block(b)) = s.devices.virtio.get(*i).map(|d| &d.device) else {
            panic!("an overlay copy for device {i}, which is not a disk");
        };
        let name = b
            .overlay_file
            .as_deref()
            .expect("an overlay copy without a name");
        // Opened inside the directory: the name cannot lead anywhere else.
        let p = dir.join(name);
        assert_eq!(
            p.parent().map(Path::to_path_buf),
            Some(PathBuf::from(dir)),
            "overlay copy {name:?} outside the snapshot"
        );
        assert!(p.is_file(), "overlay copy {name:?} is not a file");
    }
}

/// What a restore does with the state, minus KVM.
fn restore(s: &MicrovmState, tsc_delta: u64, mode: u8) {
    for v in &s.vcpus {
        let out = restore_msrs(v, tsc_delta);
        let mut before: Vec<u32> = v.msrs.iter().map(|m| m.index).collect();
        let mut after: Vec<u32> = out.iter().map(|m| m.index).collect();
        before.sort_unstable();
        after.sort_unstable();
        assert_eq!(before, after, "restore_msrs changed the set of MSRs");
        if let Some(khz) = v.tsc_khz {
            let t = tsc_ticks(tsc_delta, khz);
            assert!(u128::from(t) <= u128::from(tsc_delta) * u128::from(khz) / 1_000_000);
        }
    }

    let irq = || IrqLine::new(4).expect("eventfd");
    let serial = &s.devices.serial;
    let args = SerialArgs {
        irq: irq(),
        out: SerialOut::Sink,
    };
    if let Ok(uart) = SerialDevice::restore(args, serial) {
        assert_eq!(
            uart.save(),
            *serial,
            "the UART does not read back its state"
        );
    }
    let i8042 = &s.devices.i8042;
    let args = I8042Args {
        reset: ResetLine::new().expect("eventfd"),
        irq: irq(),
    };
    let Ok(kbd) = I8042Device::restore(args, i8042);
    let back = kbd.save();
    assert!(i8042.buf.starts_with(&back.buf), "i8042 buffer");
    assert_eq!(
        (
            back.status,
            back.ctr,
            back.cmd,
            back.outp,
            back.kbd_param_for
        ),
        (
            i8042.status,
            i8042.ctr,
            i8042.cmd,
            i8042.outp,
            i8042.kbd_param_for
        ),
        "i8042 registers"
    );

    let mem = guest_memory();
    for (i, d) in s.devices.virtio.iter().enumerate() {
        restore_device(&mem, i, d, mode);
    }
}

fn restore_device(mem: &GuestMemoryMmap, index: usize, d: &VirtioDeviceState, mode: u8) {
    let irq = IrqLine::new(5).expect("eventfd");
    match &d.device {
        DeviceState::Block(b) => {
            // The disk is replaced by a scratch image (as `--disk` does), of the saved size when
            // that is plausible.
            let path = scratch::dir(0).join(scratch::file_name(&format!("snapshot-disk{index}")));
            let f = File::create(&path).expect("scratch disk");
            f.set_len(b.device.capacity.min(1 << 40))
                .expect("sparse scratch disk");
            drop(f);
            let cfg = BlockConfig {
                path: path.clone(),
                read_only: b.config.read_only,
                id: b.config.id.clone(),
                overlay: None,
            };
            let args = BlockArgs {
                config: &cfg,
                saved_overlay: None,
                irq,
                io: IoThreadOptions::default(),
            };
            let r = BlockDevice::restore(args, &b.device);
            trace!("device {index}: virtio-blk restore: {:?}", r.as_ref().err());
            if let Ok(dev) = r {
                assert_eq!(
                    dev.avail_features() & b.device.acked_features,
                    b.device.acked_features
                );
                let dev = Arc::new(Mutex::new(dev));
                if transport(mem, index, dev.clone(), d) {
                    for _ in 0..2 {
                        crate::driver::blk_process(&mut dev.lock().expect("blk"));
                    }
                }
            }
            let _ = fs::remove_file(&path);
        }
        DeviceState::Rng(r) => {
            let res = RngDevice::restore(irq, r);
            trace!(
                "device {index}: virtio-rng restore: {:?}",
                res.as_ref().err()
            );
            if let Ok(dev) = res {
                let dev = Arc::new(Mutex::new(dev));
                if transport(mem, index, dev.clone(), d) {
                    for _ in 0..2 {
                        dev.lock().expect("rng").process_queue();
                    }
                }
            }
        }
        DeviceState::Net(n) => {
            let (backend, host) = pair(u32::from(mode >> 1 & 7));
            let r = NetDevice::restore_on(Box::new(backend), "fake TAP", irq, &n.saved);
            trace!("device {index}: virtio-net restore: {:?}", r.as_ref().err());
            if let Ok(dev) = r {
                assert_eq!(
                    dev.state().stats,
                    n.saved.device.stats,
                    "counters after restore"
                );
                let dev = Arc::new(Mutex::new(dev));
                if transport(mem, index, dev.clone(), d) {
                    host.send(&[0x5a; 60]);
                    for _ in 0..2 {
                        let mut g = dev.lock().expect("net");
                        g.process_tx();
                        g.process_rx();
                    }
                    while host.recv().is_some() {}
                }
            }
        }
    }
}

/// Restores the transport in front of `dev`; `true` when it was restored.
fn transport(
    mem: &GuestMemoryMmap,
    index: usize,
    dev: Arc<Mutex<dyn VirtioDevice>>,
    d: &VirtioDeviceState,
) -> bool {
    let args = TransportArgs {
        mem: mem.clone(),
        device: dev,
    };
    match MmioTransport::restore(args, &d.transport) {
        Ok(t) => {
            assert_eq!(
                t.save(),
                d.transport,
                "device {index}: the restored transport differs from the saved one"
            );
            true
        }
        Err(e) => {
            trace!("device {index}: transport restore: {e}");
            assert!(!e.to_string().contains('\n'));
            false
        }
    }
}

/// A plausible state of a 16 MiB, one-vCPU VM with a disk (with an overlay copy when
/// `overlay`), a NIC and an entropy device, all running with their rings in the harness's guest memory (seeds).
pub fn sample_state(overlay: bool) -> MicrovmState {
    use vmm::device_manager::mmio::MmioSlot;
    use vmm::devices::legacy::i8042::I8042State;
    use vmm::devices::legacy::serial::SerialState;
    use vmm::devices::virtio::block::device::BlockDeviceState;
    use vmm::devices::virtio::block::persist::BlockState;
    use vmm::devices::virtio::mmio::{MmioTransportState, QueueSnapshot};
    use vmm::devices::virtio::net::device::NetDeviceState;
    use vmm::devices::virtio::net::frames::NetStats;
    use vmm::devices::virtio::net::persist::{NetSaved, NetState};
    use vmm::devices::virtio::net::{MacAddr, NetConfig};
    use vmm::devices::virtio::rng::device::RngDeviceState;
    use vmm::devices::virtio::rng::persist::RngState;
    use vmm::snapshot::blob::Blob;
    use vmm::snapshot::host::HostFacts;
    use vmm::snapshot::state::MachineInfo;
    use vmm::vstate::memory::DumpStats;
    use vmm::vstate::persist::{MsrEntry, VcpuState, VmState};

    let version_1 = 1u64 << vmm::devices::virtio::VIRTIO_F_VERSION_1;
    let running = |queues: &[u64]| MmioTransportState {
        device_status: 15,
        acked_features: version_1,
        queues: queues
            .iter()
            .map(|&base| QueueSnapshot {
                max_size: 256,
                size: 16,
                ready: true,
                desc_table: base,
                avail_ring: base + 0x1000,
                used_ring: base + 0x2000,
                next_avail: 0,
                next_used: 0,
                event_idx: false,
            })
            .collect(),
        ..Default::default()
    };
    let mem_mib = 16;
    MicrovmState {
        host: HostFacts {
            cpu_vendor: "GenuineIntel".into(),
            cpu_family: 6,
            cpu_model: 85,
            cpu_stepping: 7,
            kvm_caps: vec!["KVM_CAP_XSAVE".into()],
            cpu_features: vec![],
        },
        machine: MachineInfo {
            mem_mib,
            vcpus: 1,
            cmdline: "console=ttyS0 reboot=k panic=1".into(),
            memory_regions: vmm::arch::x86_64::boot::memory_regions(mem_mib << 20)
                .iter()
                .map(|(a, len)| (a.0, *len as u64))
                .collect(),
            acpi: true,
            vmgenid: Some(vmm::arch::x86_64::layout::VMGENID_ADDR),
        },
        vm: VmState {
            pic_master: Blob::default(),
            pic_slave: Blob::default(),
            ioapic: Blob::default(),
            pit: Blob::default(),
            clock: Blob::default(),
            realtime_ns: 1_764_547_200_000_000_000,
        },
        vcpus: vec![VcpuState {
            id: 0,
            cpuid: vec![],
            mp_state: Blob::default(),
            regs: Blob::default(),
            sregs: Blob::default(),
            xsave: None,
            xcrs: None,
            debugregs: None,
            lapic: Blob::default(),
            msrs: vec![
                MsrEntry {
                    index: 0x10,
                    data: 1 << 40,
                },
                MsrEntry {
                    index: 0x6e0,
                    data: 0,
                },
            ],
            events: None,
            tsc_khz: Some(2_000_000),
        }],
        devices: DeviceStates {
            serial: SerialState {
                baud_divisor_low: 12,
                baud_divisor_high: 0,
                interrupt_enable: 1,
                interrupt_identification: 1,
                line_control: 3,
                line_status: 0x60,
                modem_control: 8,
                modem_status: 0xb0,
                scratch: 0,
                in_buffer: b"ls\n".to_vec(),
            },
            i8042: I8042State {
                status: 0x10,
                ctr: 0x61,
                cmd: 0,
                outp: 0,
                buf: vec![0xfa],
                kbd_param_for: None,
            },
            virtio: vec![
                VirtioDeviceState {
                    slot: MmioSlot {
                        addr: 0xd000_0000,
                        len: 0x1000,
                        irq: 5,
                    },
                    transport: running(&[0x1_0000]),
                    device: DeviceState::Block(BlockState {
                        config: BlockConfig {
                            path: "/var/lib/microvirt/disk.img".into(),
                            read_only: false,
                            id: Some("rootdisk".into()),
                            overlay: overlay.then(|| "/run/microvirt/disk.overlay".into()),
                        },
                        device: BlockDeviceState {
                            avail_features: version_1,
                            acked_features: version_1,
                            capacity: 1 << 20,
                            read_only: false,
                            id: *b"rootdisk\0\0\0\0\0\0\0\0\0\0\0\0",
                            needs_reset: false,
                        },
                        overlay_file: overlay.then(|| "disk0.overlay".into()),
                    }),
                },
                VirtioDeviceState {
                    slot: MmioSlot {
                        addr: 0xd000_1000,
                        len: 0x1000,
                        irq: 6,
                    },
                    transport: running(&[0x2_0000, 0x3_0000]),
                    device: DeviceState::Net(NetState {
                        config: NetConfig {
                            tap: "tap0".into(),
                            mac: None,
                        },
                        saved: NetSaved {
                            device: NetDeviceState {
                                avail_features: version_1,
                                acked_features: version_1,
                                mac: Some(MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56])),
                                stats: NetStats::default(),
                                needs_reset: false,
                            },
                            rx_pending: Some(vec![0xff; 42]),
                        },
                    }),
                },
                VirtioDeviceState {
                    slot: MmioSlot {
                        addr: 0xd000_2000,
                        len: 0x1000,
                        irq: 7,
                    },
                    transport: running(&[0x4_0000]),
                    device: DeviceState::Rng(RngState {
                        device: RngDeviceState {
                            acked_features: version_1,
                            needs_reset: false,
                        },
                    }),
                },
            ],
            acpi_pm: Some(vmm::devices::acpi::AcpiPmState { ged_pending: 1 }),
        },
        memory: DumpStats::default(),
    }
}
