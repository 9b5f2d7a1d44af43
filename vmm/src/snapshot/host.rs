//! The host facts a snapshot depends on, and the check that the restoring host matches.
//!
//! A guest keeps running on the CPU features it found at boot, so restore insists on the same
//! CPU vendor, family and model, on every CPUID feature the guest saw being available here, and
//! on the KVM capabilities the saved state needs.

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Cap, Kvm};
use serde::{Deserialize, Serialize};

use crate::vstate::persist::{CpuidEntry, VcpuCaps};

/// Facts about the host that took the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// CPUID vendor string, e.g. `AuthenticAMD`.
    pub cpu_vendor: String,
    pub cpu_family: u32,
    pub cpu_model: u32,
    pub cpu_stepping: u32,
    /// The KVM capabilities the saved state relies on (names as in the KVM API).
    pub kvm_caps: Vec<String>,
    /// The feature leaves of KVM_GET_SUPPORTED_CPUID (what a guest booted here may have been
    /// shown and may use).
    pub cpu_features: Vec<CpuidEntry>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    #[error("host CPU mismatch: the snapshot was taken on {snap}, this host is {here}")]
    Cpu { snap: String, here: String },
    #[error(
        "host CPU lacks features the guest uses: CPUID leaf {leaf:#x}.{index} {reg} bits {bits:#x}"
    )]
    Features {
        leaf: u32,
        index: u32,
        reg: &'static str,
        bits: u32,
    },
    #[error("KVM on this host lacks {0}, which the snapshot needs")]
    KvmCap(String),
    #[error("KVM_GET_SUPPORTED_CPUID: {0}")]
    Cpuid(String),
}

/// Capabilities every VM needs, plus the ones state saving uses when present.
fn caps_in_use(vcpu: VcpuCaps) -> Vec<(&'static str, Cap)> {
    let mut v = vec![
        ("KVM_CAP_IRQCHIP", Cap::Irqchip),
        ("KVM_CAP_USER_MEMORY", Cap::UserMemory),
        ("KVM_CAP_PIT2", Cap::Pit2),
        ("KVM_CAP_IRQFD", Cap::Irqfd),
        ("KVM_CAP_IOEVENTFD", Cap::Ioeventfd),
        ("KVM_CAP_MP_STATE", Cap::MpState),
        ("KVM_CAP_ADJUST_CLOCK", Cap::AdjustClock),
        ("KVM_CAP_EXT_CPUID", Cap::ExtCpuid),
    ];
    let optional = [
        (vcpu.xsave, "KVM_CAP_XSAVE", Cap::Xsave),
        (vcpu.xcrs, "KVM_CAP_XCRS", Cap::Xcrs),
        (vcpu.debugregs, "KVM_CAP_DEBUGREGS", Cap::Debugregs),
        (vcpu.events, "KVM_CAP_VCPU_EVENTS", Cap::VcpuEvents),
        (vcpu.tsc_khz, "KVM_CAP_GET_TSC_KHZ", Cap::GetTscKhz),
    ];
    v.extend(optional.into_iter().filter(|o| o.0).map(|o| (o.1, o.2)));
    v
}

fn cap_by_name(name: &str) -> Option<Cap> {
    caps_in_use(VcpuCaps {
        xsave: true,
        xcrs: true,
        debugregs: true,
        events: true,
        tsc_khz: true,
        immediate_exit: true,
    })
    .into_iter()
    .find(|(n, _)| *n == name)
    .map(|(_, c)| c)
}

/// The CPU identity as KVM reports it (leaf 0 vendor, leaf 1 signature).
pub fn cpu_identity(cpuid: &[CpuidEntry]) -> (String, u32, u32, u32) {
    let leaf = |f: u32| cpuid.iter().find(|e| e.function == f && e.index == 0);
    let vendor = leaf(0).map_or_else(String::new, |e| {
        let mut b = Vec::with_capacity(12);
        for r in [e.ebx, e.edx, e.ecx] {
            b.extend_from_slice(&r.to_le_bytes());
        }
        String::from_utf8_lossy(&b)
            .trim_end_matches('\0')
            .to_string()
    });
    let (family, model, stepping) = leaf(1).map_or((0, 0, 0), |e| {
        let base_family = (e.eax >> 8) & 0xf;
        let base_model = (e.eax >> 4) & 0xf;
        let family = if base_family == 0xf {
            base_family + ((e.eax >> 20) & 0xff)
        } else {
            base_family
        };
        let model = if base_family == 0x6 || base_family == 0xf {
            base_model | (((e.eax >> 16) & 0xf) << 4)
        } else {
            base_model
        };
        (family, model, e.eax & 0xf)
    });
    (vendor, family, model, stepping)
}

fn supported_cpuid(kvm: &Kvm) -> Result<Vec<CpuidEntry>, HostError> {
    let c: CpuId = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| HostError::Cpuid(e.to_string()))?;
    Ok(c.as_slice().iter().map(CpuidEntry::from).collect())
}

impl HostFacts {
    /// The facts of this host, for a snapshot that used `vcpu_caps`.
    pub fn probe(kvm: &Kvm, vcpu_caps: VcpuCaps) -> Result<Self, HostError> {
        let supported = supported_cpuid(kvm)?;
        let (cpu_vendor, cpu_family, cpu_model, cpu_stepping) = cpu_identity(&supported);
        let cpu_features = supported
            .into_iter()
            .filter(|e| {
                FEATURE_REGS
                    .iter()
                    .any(|f| f.0 == e.function && f.1 == e.index)
            })
            .collect();
        Ok(Self {
            cpu_features,
            cpu_vendor,
            cpu_family,
            cpu_model,
            cpu_stepping,
            kvm_caps: caps_in_use(vcpu_caps)
                .into_iter()
                .map(|(n, _)| n.to_string())
                .collect(),
        })
    }

    fn describe(&self) -> String {
        format!(
            "{} family {} model {}",
            self.cpu_vendor, self.cpu_family, self.cpu_model
        )
    }

    /// Checks that this host (`kvm`) can run the guest: same CPU, every CPU feature KVM
    /// offered at snapshot time offered here too, the KVM capabilities present.
    pub fn check(&self, kvm: &Kvm) -> Result<(), HostError> {
        let here_cpuid = supported_cpuid(kvm)?;
        let (vendor, family, model, _) = cpu_identity(&here_cpuid);
        if (vendor.as_str(), family, model)
            != (self.cpu_vendor.as_str(), self.cpu_family, self.cpu_model)
        {
            return Err(HostError::Cpu {
                snap: self.describe(),
                here: format!("{vendor} family {family} model {model}"),
            });
        }
        for name in &self.kvm_caps {
            match cap_by_name(name) {
                Some(cap) if kvm.check_extension(cap) => {}
                _ => return Err(HostError::KvmCap(name.clone())),
            }
        }
        check_features(&here_cpuid, &self.cpu_features)
    }
}

/// Feature registers whose bits a guest may rely on, with bits that do not describe the CPU
/// (leaf 1 ECX.31 hypervisor, EDX.28 HTT: the VMM sets them itself).
const FEATURE_REGS: &[(u32, u32, usize, &str, u32)] = &[
    (0x1, 0, 2, "ecx", 1 << 31),
    (0x1, 0, 3, "edx", 1 << 28),
    (0x7, 0, 1, "ebx", 0),
    (0x7, 0, 2, "ecx", 0),
    (0x7, 0, 3, "edx", 0),
    (0xd, 1, 0, "eax", 0),
    (0x8000_0001, 0, 2, "ecx", 0),
    (0x8000_0001, 0, 3, "edx", 0),
];

fn reg(e: &CpuidEntry, i: usize) -> u32 {
    [e.eax, e.ebx, e.ecx, e.edx][i]
}

/// Every feature bit in `saved` must be in `host` too.
pub fn check_features(host: &[CpuidEntry], saved: &[CpuidEntry]) -> Result<(), HostError> {
    let guest = saved;
    let find = |t: &[CpuidEntry], f: u32, i: u32| {
        t.iter().find(|e| e.function == f && e.index == i).copied()
    };
    for &(leaf, index, r, name, vmm_bits) in FEATURE_REGS {
        let Some(g) = find(guest, leaf, index) else {
            continue;
        };
        let h = find(host, leaf, index).map_or(0, |e| reg(&e, r));
        let missing = reg(&g, r) & !h & !vmm_bits;
        if missing != 0 {
            return Err(HostError::Features {
                leaf,
                index,
                reg: name,
                bits: missing,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(function: u32, index: u32, regs: [u32; 4]) -> CpuidEntry {
        CpuidEntry {
            function,
            index,
            flags: 0,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
        }
    }

    #[test]
    fn identity_decodes_vendor_family_model() {
        // "AuthenticAMD", family 0x19 model 0x01 stepping 1 (0x00a00f11).
        let t = [
            e(0, 0, [0x10, 0x6874_7541, 0x444d_4163, 0x6974_6e65]),
            e(1, 0, [0x00a0_0f11, 0, 0, 0]),
        ];
        assert_eq!(
            cpu_identity(&t),
            ("AuthenticAMD".to_string(), 0x19, 0x01, 1)
        );
        // Intel family 6 model 0x8f (0x000806f8).
        let t = [e(1, 0, [0x0008_06f8, 0, 0, 0])];
        assert_eq!(cpu_identity(&t).1, 6);
        assert_eq!(cpu_identity(&t).2, 0x8f);
    }

    #[test]
    fn features_must_be_a_subset_except_the_vmm_bits() {
        let host = [e(1, 0, [0, 0, 0b1010, 0]), e(7, 0, [0, 0xff, 0, 0])];
        let ok = [
            e(1, 0, [0, 0, 0b1000 | (1 << 31), 1 << 28]),
            e(7, 0, [0, 0x0f, 0, 0]),
        ];
        assert_eq!(check_features(&host, &ok), Ok(()));
        let bad = [e(7, 0, [0, 0x100, 0, 0])];
        let err = check_features(&host, &bad).unwrap_err();
        assert_eq!(
            err,
            HostError::Features {
                leaf: 7,
                index: 0,
                reg: "ebx",
                bits: 0x100
            }
        );
        assert!(err.to_string().contains("leaf 0x7.0 ebx bits 0x100"));
    }
}
