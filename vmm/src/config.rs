//! VM configuration: from the command line or a JSON file.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::arch::x86_64::layout::MAX_VCPUS;
use crate::devices::virtio::{BlockConfig, NetConfig, RngConfig};

pub const DEFAULT_MEM_MIB: u64 = 128;
pub const DEFAULT_VCPUS: u8 = 1;
/// Smallest VM: the low 1 MiB plus room for a tiny kernel.
pub const MIN_MEM_MIB: u64 = 2;
/// Largest VM this VMM accepts (1 TiB).
pub const MAX_MEM_MIB: u64 = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("vcpus must be between 1 and {MAX_VCPUS}, got {0}")]
    Vcpus(u64),
    #[error("mem_mib must be between {MIN_MEM_MIB} and {MAX_MEM_MIB}, got {0}")]
    Memory(u64),
    #[error("serial must be stdio, none or unix:PATH, got {0:?}")]
    Serial(String),
    #[error("no kernel given")]
    NoKernel,
}

/// Where the guest serial console goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SerialConfig {
    /// Output to stdout, input from stdin.
    #[default]
    Stdio,
    /// No console (output discarded, the guest gets `8250.nr_uarts=0`... not added: the UART still exists).
    None,
    /// A unix socket the VMM listens on; one client at a time is the console.
    Unix(PathBuf),
}

impl FromStr for SerialConfig {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stdio" => Ok(Self::Stdio),
            "none" => Ok(Self::None),
            _ => match s.strip_prefix("unix:") {
                Some(p) if !p.is_empty() => Ok(Self::Unix(PathBuf::from(p))),
                _ => Err(ConfigError::Serial(s.to_string())),
            },
        }
    }
}

impl fmt::Display for SerialConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio => f.write_str("stdio"),
            Self::None => f.write_str("none"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl Serialize for SerialConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SerialConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn default_mem() -> u64 {
    DEFAULT_MEM_MIB
}
fn default_vcpus() -> u64 {
    u64::from(DEFAULT_VCPUS)
}
fn default_true() -> bool {
    true
}

/// Everything needed to build a VM.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub kernel: PathBuf,
    #[serde(default)]
    pub initrd: Option<PathBuf>,
    /// Appended to the VMM's default command line.
    #[serde(default)]
    pub cmdline: Option<String>,
    /// When false, the VMM adds only device entries (virtio_mmio.device=...) to `cmdline`.
    #[serde(default = "default_true")]
    pub default_cmdline: bool,
    #[serde(default = "default_mem")]
    pub mem_mib: u64,
    #[serde(default = "default_vcpus")]
    pub vcpus: u64,
    #[serde(default)]
    pub serial: SerialConfig,
    /// virtio-blk disks, in order: /dev/vda, /dev/vdb, ...
    #[serde(default)]
    pub disks: Vec<BlockConfig>,
    /// virtio-net interfaces, in order: eth0, eth1, ...
    #[serde(default)]
    pub nets: Vec<NetConfig>,
    /// A virtio-rng device (entropy from the host), after the disks and NICs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<RngConfig>,
    /// ACPI tables (RSDP, XSDT, FADT, MADT, DSDT) and the ACPI power button, sleep and reset
    /// registers; on by default. The MP table and the `virtio_mmio.device=` command-line
    /// entries are there either way, for kernels without ACPI (see `vmm/README.md`).
    #[serde(default = "default_true")]
    pub acpi: bool,
    /// What a guest-initiated reboot does: end the VM (`exit`, the default, Firecracker's
    /// semantics), restart the guest in this process (`in-place`), or restart it when the
    /// guest uses ACPI and end the VM when not (`in-place-if-acpi`, the launcher's).
    #[serde(default)]
    pub reboot: RebootPolicy,
}

/// What a guest-initiated reboot (i8042 reset line, ACPI reset register, KVM reset event) does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RebootPolicy {
    /// The VM ends as a guest reset (exit status 0).
    #[default]
    Exit,
    /// vCPUs, devices and RAM are reset and the kernel is loaded again: the guest boots anew
    /// in the same process, with the same disks, overlays and TAPs.
    InPlace,
    /// In place when the guest runs with ACPI (it armed the GED's interrupt, as a kernel with
    /// ACPI does at boot), else exit: a guest without ACPI has no way to power off, and its
    /// reset is the only way it can end the VM (the launcher's policy; vmm/README.md).
    InPlaceIfAcpi,
}

impl VmConfig {
    pub fn new(kernel: impl Into<PathBuf>) -> Self {
        Self {
            kernel: kernel.into(),
            initrd: None,
            cmdline: None,
            default_cmdline: true,
            mem_mib: DEFAULT_MEM_MIB,
            vcpus: u64::from(DEFAULT_VCPUS),
            serial: SerialConfig::Stdio,
            disks: Vec::new(),
            nets: Vec::new(),
            rng: None,
            acpi: true,
            reboot: RebootPolicy::Exit,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kernel.as_os_str().is_empty() {
            return Err(ConfigError::NoKernel);
        }
        if self.vcpus == 0 || self.vcpus > u64::from(MAX_VCPUS) {
            return Err(ConfigError::Vcpus(self.vcpus));
        }
        if !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&self.mem_mib) {
            return Err(ConfigError::Memory(self.mem_mib));
        }
        Ok(())
    }

    /// The vCPU count, once validated.
    pub fn vcpu_count(&self) -> u8 {
        self.vcpus.clamp(1, u64::from(MAX_VCPUS)) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_syntax() {
        assert_eq!(
            "stdio".parse::<SerialConfig>().unwrap(),
            SerialConfig::Stdio
        );
        assert_eq!("none".parse::<SerialConfig>().unwrap(), SerialConfig::None);
        assert_eq!(
            "unix:/tmp/c".parse::<SerialConfig>().unwrap(),
            SerialConfig::Unix("/tmp/c".into())
        );
        assert!("unix:".parse::<SerialConfig>().is_err());
        assert!("tcp:1".parse::<SerialConfig>().is_err());
    }

    #[test]
    fn json_defaults_and_validation() {
        let c: VmConfig = serde_json::from_str(r#"{"kernel": "/k"}"#).unwrap();
        assert_eq!(
            (c.mem_mib, c.vcpus, c.serial.clone()),
            (128, 1, SerialConfig::Stdio)
        );
        c.validate().unwrap();
        let bad: VmConfig = serde_json::from_str(r#"{"kernel": "/k", "vcpus": 0}"#).unwrap();
        assert_eq!(bad.validate(), Err(ConfigError::Vcpus(0)));
        let bad: VmConfig = serde_json::from_str(r#"{"kernel": "/k", "mem_mib": 1}"#).unwrap();
        assert_eq!(bad.validate(), Err(ConfigError::Memory(1)));
        assert!(serde_json::from_str::<VmConfig>(r#"{"kernel": "/k", "bogus": 1}"#).is_err());
        let round: VmConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(round, c);
        assert_eq!(c.rng, None);
        assert!(c.acpi);
        let off: VmConfig = serde_json::from_str(r#"{"kernel": "/k", "acpi": false}"#).unwrap();
        assert!(!off.acpi);
        let r: VmConfig = serde_json::from_str(r#"{"kernel": "/k", "rng": {}}"#).unwrap();
        assert_eq!(r.rng, Some(RngConfig::default()));
        let round: VmConfig = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(round, r);
        let e = serde_json::from_str::<VmConfig>(r#"{"kernel": "/k", "rng": {"rate": 5}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `rate`"), "{e}");
    }
}
