//! The serde payload of the state file: everything about a paused VM except guest memory
//! (the memory file) and disk contents.

use serde::{Deserialize, Serialize};

use super::host::HostFacts;
use crate::device_manager::persist::VirtioDeviceState;
use crate::devices::acpi::AcpiPmState;
use crate::devices::legacy::i8042::I8042State;
use crate::devices::legacy::serial::SerialState;
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
    pub serial: SerialState,
    pub i8042: I8042State,
    /// virtio devices in slot order.
    pub devices: Vec<VirtioDeviceState>,
    /// The ACPI registers' state (events the guest has not read), when the VM has ACPI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acpi_pm: Option<AcpiPmState>,
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
}
