//! CPUID normalization: what each vCPU reports about itself and the hypervisor.
//!
//! Starts from KVM_GET_SUPPORTED_CPUID and fixes the leaves a guest uses to find
//! out that it runs on KVM (hypervisor bit, KVM signature leaves) and how many
//! CPUs it has (APIC IDs, logical processor counts, topology leaves).

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_PERFMON: u32 = 0xa;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_KVM_SIGNATURE: u32 = 0x4000_0000;
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
const LEAF_AMD_SIZE_IDS: u32 = 0x8000_0008;
const LEAF_AMD_EXT_APIC_ID: u32 = 0x8000_001e;

const ECX_HYPERVISOR: u32 = 1 << 31;
const ECX_TSC_DEADLINE: u32 = 1 << 24;
const EDX_HTT: u32 = 1 << 28;

/// "KVMKVMKVM\0\0\0" as EBX, ECX, EDX.
const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];

#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    #[error("vcpu count {0} is outside 1..=255")]
    VcpuCount(u8),
    #[error("CPUID table is full; cannot add leaf {0:#x}")]
    TableFull(u32),
}

/// Bits needed to number `n` items (ceil(log2(n))).
fn bits_for(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

fn find_mut(
    entries: &mut [kvm_cpuid_entry2],
    function: u32,
) -> impl Iterator<Item = &mut kvm_cpuid_entry2> {
    entries.iter_mut().filter(move |e| e.function == function)
}

/// Advertises the TSC-deadline timer (leaf 1 ECX bit 24). KVM emulates it in software but does
/// not report it in KVM_GET_SUPPORTED_CPUID: the VMM sets it when KVM has
/// `KVM_CAP_TSC_DEADLINE_TIMER`. Without it Linux calibrates the local APIC timer against the
/// PIT at boot and programs it through APIC MMIO writes, each one an emulated exit.
pub fn enable_tsc_deadline(cpuid: &mut CpuId) {
    for e in find_mut(cpuid.as_mut_slice(), LEAF_FEATURES) {
        e.ecx |= ECX_TSC_DEADLINE;
    }
}

/// Normalizes `cpuid` (a copy of KVM's supported CPUID) for vCPU `vcpu_id` of `vcpu_count`.
/// Topology: one socket, `vcpu_count` cores, one thread per core; APIC ID = vCPU index.
pub fn normalize(cpuid: &mut CpuId, vcpu_id: u8, vcpu_count: u8) -> Result<(), CpuidError> {
    if vcpu_count == 0 {
        return Err(CpuidError::VcpuCount(vcpu_count));
    }
    let count = u32::from(vcpu_count);
    let apic_id = u32::from(vcpu_id);
    let core_bits = bits_for(count);

    let has_kvm_leaf = cpuid
        .as_slice()
        .iter()
        .any(|e| e.function == LEAF_KVM_SIGNATURE);
    if !has_kvm_leaf {
        let sig = kvm_cpuid_entry2 {
            function: LEAF_KVM_SIGNATURE,
            eax: LEAF_KVM_FEATURES,
            ebx: KVM_SIGNATURE[0],
            ecx: KVM_SIGNATURE[1],
            edx: KVM_SIGNATURE[2],
            ..Default::default()
        };
        cpuid
            .push(sig)
            .map_err(|_| CpuidError::TableFull(LEAF_KVM_SIGNATURE))?;
    }

    let entries = cpuid.as_mut_slice();
    for e in find_mut(entries, LEAF_FEATURES) {
        e.ecx |= ECX_HYPERVISOR;
        // EBX[31:24] initial APIC ID, EBX[23:16] logical processors per package, EBX[15:8] CLFLUSH size.
        e.ebx = (apic_id << 24) | ((count & 0xff) << 16) | (e.ebx & 0xffff);
        if count > 1 {
            e.edx |= EDX_HTT;
        } else {
            e.edx &= !EDX_HTT;
        }
    }
    for e in find_mut(entries, LEAF_CACHE_PARAMS) {
        // EAX[31:26] cores per package - 1; EAX[25:14] logical CPUs sharing this cache - 1.
        let cache_level = (e.eax >> 5) & 0x7;
        let sharing = if cache_level >= 3 { count - 1 } else { 0 };
        e.eax = (e.eax & 0x3fff) | ((count - 1) << 26) | (sharing << 14);
    }
    for e in find_mut(entries, LEAF_PERFMON) {
        // No virtual PMU.
        e.eax = 0;
        e.ebx = 0;
        e.ecx = 0;
        e.edx = 0;
    }
    for e in find_mut(entries, LEAF_EXT_TOPOLOGY) {
        e.flags |= KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
        e.edx = apic_id;
        match e.index {
            0 => {
                // SMT level: one thread per core.
                e.eax = 0;
                e.ebx = 1;
                e.ecx = (1 << 8) | e.index;
            }
            1 => {
                // Core level: all vCPUs in one package.
                e.eax = core_bits;
                e.ebx = count;
                e.ecx = (2 << 8) | e.index;
            }
            _ => {
                e.eax = 0;
                e.ebx = 0;
                e.ecx = e.index;
            }
        }
    }
    for e in find_mut(entries, LEAF_KVM_SIGNATURE) {
        e.eax = e.eax.max(LEAF_KVM_FEATURES);
        e.ebx = KVM_SIGNATURE[0];
        e.ecx = KVM_SIGNATURE[1];
        e.edx = KVM_SIGNATURE[2];
    }
    for e in find_mut(entries, LEAF_AMD_SIZE_IDS) {
        // ECX[15:12] APIC ID size, ECX[7:0] number of cores - 1.
        e.ecx = (e.ecx & !0xf0ff) | (core_bits << 12) | (count - 1);
    }
    for e in find_mut(entries, LEAF_AMD_EXT_APIC_ID) {
        e.eax = apic_id;
        e.ebx = apic_id & 0xff; // core id, one thread per core
        e.ecx = 0; // node 0
        e.edx = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> CpuId {
        let entries = vec![
            kvm_cpuid_entry2 {
                function: 1,
                ebx: 0x0000_0800,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0xb,
                index: 0,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0xb,
                index: 1,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0x8000_0008,
                ecx: 0x7007,
                ..Default::default()
            },
        ];
        CpuId::from_entries(&entries).unwrap()
    }

    fn leaf(c: &CpuId, f: u32, i: u32) -> kvm_cpuid_entry2 {
        *c.as_slice()
            .iter()
            .find(|e| e.function == f && e.index == i)
            .unwrap()
    }

    #[test]
    fn hypervisor_bit_apic_id_and_counts() {
        let mut c = base();
        normalize(&mut c, 3, 4).unwrap();
        let l1 = leaf(&c, 1, 0);
        assert_ne!(l1.ecx & ECX_HYPERVISOR, 0);
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0x0800, "CLFLUSH size kept");
        assert_ne!(l1.edx & EDX_HTT, 0);
        let core = leaf(&c, 0xb, 1);
        assert_eq!((core.eax, core.ebx, core.edx), (2, 4, 3));
        assert_eq!((core.ecx >> 8) & 0xff, 2);
        let amd = leaf(&c, 0x8000_0008, 0);
        assert_eq!(amd.ecx & 0xff, 3);
        assert_eq!((amd.ecx >> 12) & 0xf, 2);
    }

    #[test]
    fn kvm_signature_leaf_added_when_missing() {
        let mut c = base();
        normalize(&mut c, 0, 1).unwrap();
        let sig = leaf(&c, LEAF_KVM_SIGNATURE, 0);
        let mut bytes = Vec::new();
        for r in [sig.ebx, sig.ecx, sig.edx] {
            bytes.extend_from_slice(&r.to_le_bytes());
        }
        assert_eq!(&bytes[..9], b"KVMKVMKVM");
        assert_eq!(leaf(&c, 1, 0).edx & EDX_HTT, 0);
    }

    #[test]
    fn tsc_deadline_bit() {
        let mut c = base();
        assert_eq!(leaf(&c, 1, 0).ecx & ECX_TSC_DEADLINE, 0);
        enable_tsc_deadline(&mut c);
        normalize(&mut c, 0, 1).unwrap();
        assert_ne!(leaf(&c, 1, 0).ecx & ECX_TSC_DEADLINE, 0);
    }

    #[test]
    fn zero_vcpus_refused_and_bits() {
        assert!(normalize(&mut base(), 0, 0).is_err());
        assert_eq!(
            (
                bits_for(1),
                bits_for(2),
                bits_for(3),
                bits_for(4),
                bits_for(5)
            ),
            (0, 1, 2, 2, 3)
        );
    }
}
