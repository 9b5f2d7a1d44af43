//! The serde payload of the state file: everything about a paused VM except guest memory
//! (the memory file) and disk contents.

use serde::{Deserialize, Serialize};

use super::host::HostFacts;
use crate::device_manager::persist::DeviceStates;
use crate::vstate::memory::DumpStats;
use crate::vstate::persist::{VcpuState, VmState};

/// The machine as configured: what restore rebuilds before applying state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub mem_mib: u64,
    pub vcpus: u8,
    /// The command line the guest booted with (informational: it lives in guest memory).
    pub cmdline: String,
    /// Guest RAM regions `(guest address, length)`, stored back to back in the memory file.
    pub memory_regions: Vec<(u64, u64)>,
    /// Whether the VM has ACPI (the tables are in guest RAM; restore puts the ACPI registers
    /// back on the bus). Absent in format 1.0 snapshots, which predate ACPI: false.
    #[serde(default)]
    pub acpi: bool,
    /// The guest-physical address of the VM generation ID when the guest's DSDT has the
    /// `\_SB.VGEN` device (acpi/vmgenid.rs): every restore writes a new ID there and notifies
    /// the guest. Absent before format 1.2 (the guest has no such device): nothing is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmgenid: Option<u64>,
}

/// The whole payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MicrovmState {
    pub host: HostFacts,
    pub machine: MachineInfo,
    pub vm: VmState,
    pub vcpus: Vec<VcpuState>,
    /// Every device: the fields `serial`, `i8042`, `devices` (virtio, in slot order) and
    /// `acpi_pm` of the payload (`device_manager/persist.rs`).
    #[serde(flatten)]
    pub devices: DeviceStates,
    /// What writing the memory file did (informational).
    pub memory: DumpStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_info_of_every_minor_parses() {
        // 1.0: no `acpi`; 1.1: no `vmgenid`; 1.2: both.
        let v10 = r#"{"mem_mib":128,"vcpus":1,"cmdline":"x","memory_regions":[[0,134217728]]}"#;
        let m: MachineInfo = serde_json::from_str(v10).unwrap();
        assert!(!m.acpi);
        assert_eq!(m.vmgenid, None);
        let v11 = r#"{"mem_mib":128,"vcpus":1,"cmdline":"x","memory_regions":[],"acpi":true}"#;
        let m: MachineInfo = serde_json::from_str(v11).unwrap();
        assert!(m.acpi);
        assert_eq!(m.vmgenid, None);
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains("vmgenid"), "{text}");
        let v12 = MachineInfo {
            vmgenid: Some(0xf_f000),
            ..m
        };
        let text = serde_json::to_string(&v12).unwrap();
        assert!(text.contains(r#""vmgenid":1044480"#), "{text}");
        assert_eq!(serde_json::from_str::<MachineInfo>(&text).unwrap(), v12);
    }

    use serde::Serialize;

    use crate::device_manager::mmio::MmioSlot;
    use crate::device_manager::persist::{DeviceState, VirtioDeviceState};
    use crate::devices::acpi::AcpiPmState;
    use crate::devices::legacy::i8042::I8042State;
    use crate::devices::legacy::serial::SerialState;
    use crate::devices::virtio::block::device::BlockDeviceState;
    use crate::devices::virtio::block::persist::BlockState;
    use crate::devices::virtio::block::BlockConfig;
    use crate::devices::virtio::mmio::{MmioTransportState, QueueSnapshot};
    use crate::devices::virtio::net::device::NetDeviceState;
    use crate::devices::virtio::net::frames::NetStats;
    use crate::devices::virtio::net::persist::{NetSaved, NetState};
    use crate::devices::virtio::net::{MacAddr, NetConfig};
    use crate::devices::virtio::rng::device::RngDeviceState;
    use crate::devices::virtio::rng::persist::RngState;
    use crate::snapshot::blob::Blob;
    use crate::vstate::persist::{CpuidEntry, MsrEntry};

    /// The payload as format 1.2 laid it out before the device manager's `DeviceStates`: the
    /// devices' fields at the top level, a NIC's three fields in one struct.
    #[derive(Serialize)]
    struct OldMicrovmState {
        host: HostFacts,
        machine: MachineInfo,
        vm: VmState,
        vcpus: Vec<VcpuState>,
        serial: SerialState,
        i8042: I8042State,
        devices: Vec<OldVirtioDeviceState>,
        #[serde(skip_serializing_if = "Option::is_none")]
        acpi_pm: Option<AcpiPmState>,
        memory: DumpStats,
    }

    #[derive(Serialize)]
    struct OldVirtioDeviceState {
        slot: MmioSlot,
        transport: MmioTransportState,
        device: OldDeviceState,
    }

    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "lowercase")]
    enum OldDeviceState {
        Block(BlockState),
        Net(OldNetState),
        Rng(RngState),
    }

    #[derive(Serialize)]
    struct OldNetState {
        config: NetConfig,
        device: NetDeviceState,
        rx_pending: Option<OldBytes>,
    }

    #[derive(Serialize)]
    struct OldBytes(#[serde(with = "crate::snapshot::blob::bytes")] Vec<u8>);

    /// The old layout of `s`, built field by field.
    fn old_layout(s: &MicrovmState) -> OldMicrovmState {
        let devices = s
            .devices
            .virtio
            .iter()
            .map(|d| OldVirtioDeviceState {
                slot: d.slot,
                transport: d.transport.clone(),
                device: match &d.device {
                    DeviceState::Block(b) => OldDeviceState::Block(b.clone()),
                    DeviceState::Net(n) => OldDeviceState::Net(OldNetState {
                        config: n.config.clone(),
                        device: n.saved.device.clone(),
                        rx_pending: n.saved.rx_pending.clone().map(OldBytes),
                    }),
                    DeviceState::Rng(r) => OldDeviceState::Rng(r.clone()),
                },
            })
            .collect();
        OldMicrovmState {
            host: s.host.clone(),
            machine: s.machine.clone(),
            vm: s.vm.clone(),
            vcpus: s.vcpus.clone(),
            serial: s.devices.serial.clone(),
            i8042: s.devices.i8042.clone(),
            devices,
            acpi_pm: s.devices.acpi_pm,
            memory: s.memory,
        }
    }

    fn slot(i: u32) -> MmioSlot {
        MmioSlot {
            addr: 0xd000_0000 + u64::from(i) * 0x1000,
            len: 0x1000,
            irq: 5 + i,
        }
    }

    /// A VM with a disk (with an overlay), a NIC (a frame pending) and an entropy device.
    fn sample() -> MicrovmState {
        let version_1 = 1u64 << 32;
        let transport = MmioTransportState {
            device_status: 0xf,
            acked_features: version_1,
            queues: vec![QueueSnapshot {
                max_size: 256,
                size: 256,
                ready: true,
                desc_table: 0x1_0000,
                avail_ring: 0x1_1000,
                used_ring: 0x1_2000,
                next_avail: 7,
                next_used: 7,
                event_idx: true,
            }],
            interrupt_status: 1,
            ..MmioTransportState::default()
        };
        MicrovmState {
            host: HostFacts {
                cpu_vendor: "GenuineIntel".into(),
                cpu_family: 6,
                cpu_model: 85,
                cpu_stepping: 7,
                kvm_caps: vec!["KVM_CAP_IRQCHIP".into()],
                cpu_features: vec![CpuidEntry {
                    function: 7,
                    index: 0,
                    flags: 1,
                    eax: 0,
                    ebx: 0xd19f_4fbb,
                    ecx: 0,
                    edx: 0,
                }],
            },
            machine: MachineInfo {
                mem_mib: 128,
                vcpus: 1,
                cmdline: "console=ttyS0".into(),
                memory_regions: vec![(0, 128 << 20)],
                acpi: true,
                vmgenid: Some(0xf_f000),
            },
            vm: VmState {
                pic_master: Blob::default(),
                pic_slave: Blob::default(),
                ioapic: Blob::default(),
                pit: Blob::default(),
                clock: Blob::default(),
                realtime_ns: 1_700_000_000_000_000_000,
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
                msrs: vec![MsrEntry {
                    index: 0x10,
                    data: 1 << 40,
                }],
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
                    kbd_param_for: Some(0xed),
                },
                virtio: vec![
                    VirtioDeviceState {
                        slot: slot(0),
                        transport: transport.clone(),
                        device: DeviceState::Block(BlockState {
                            config: BlockConfig {
                                path: "/disk.img".into(),
                                read_only: false,
                                id: Some("root".into()),
                                overlay: Some("/run/disk.overlay".into()),
                            },
                            device: BlockDeviceState {
                                avail_features: version_1,
                                acked_features: version_1,
                                capacity: 1 << 20,
                                read_only: false,
                                id: *b"root\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
                                needs_reset: false,
                            },
                            overlay_file: Some("disk0.overlay".into()),
                        }),
                    },
                    VirtioDeviceState {
                        slot: slot(1),
                        transport: transport.clone(),
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
                                    stats: NetStats {
                                        rx_frames: 2,
                                        ..NetStats::default()
                                    },
                                    needs_reset: false,
                                },
                                rx_pending: Some(vec![0xff; 42]),
                            },
                        }),
                    },
                    VirtioDeviceState {
                        slot: slot(2),
                        transport,
                        device: DeviceState::Rng(RngState {
                            device: RngDeviceState {
                                acked_features: version_1,
                                needs_reset: true,
                            },
                        }),
                    },
                ],
                acpi_pm: Some(AcpiPmState { ged_pending: 2 }),
            },
            memory: DumpStats {
                ram_bytes: 128 << 20,
                candidate_bytes: 4 << 20,
                written_bytes: 3 << 20,
            },
        }
    }

    #[test]
    fn the_payload_encodes_as_before_the_device_manager_saved_it() {
        let s = sample();
        let new = serde_json::to_vec(&s).unwrap();
        let old = serde_json::to_vec(&old_layout(&s)).unwrap();
        assert_eq!(
            String::from_utf8(new).unwrap(),
            String::from_utf8(old.clone()).unwrap()
        );
        assert_eq!(serde_json::from_slice::<MicrovmState>(&old).unwrap(), s);
        // Without ACPI and without a pending frame.
        let mut s = s;
        s.devices.acpi_pm = None;
        if let DeviceState::Net(n) = &mut s.devices.virtio[1].device {
            n.saved.rx_pending = None;
        }
        let new = serde_json::to_vec(&s).unwrap();
        let old = serde_json::to_vec(&old_layout(&s)).unwrap();
        assert_eq!(new, old);
        assert!(!String::from_utf8(new).unwrap().contains("acpi_pm"));
        // A format 1.0 payload: no `acpi_pm`, no `rx_pending`.
        let mut v: serde_json::Value = serde_json::from_slice(&old).unwrap();
        let net = v["devices"][1]["device"].as_object_mut().unwrap();
        assert!(net.remove("rx_pending").is_some());
        assert_eq!(serde_json::from_value::<MicrovmState>(v).unwrap(), s);
    }
}
