//! KVM's state structures travel as opaque byte blobs (base64 in the JSON payload): their layout
//! is the kernel ABI, which only ever grows at the end.

use std::fmt;
use std::marker::PhantomData;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_pit_state2,
    kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Plain data: every bit pattern of `size_of::<Self>()` bytes is a valid value.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs (and unions) made of integers and arrays of
/// integers, without references, pointers, `bool`s or enums.
pub unsafe trait Pod: Default + 'static {}

// SAFETY: all of these are bindgen `#[repr(C)]` structs/unions of integer fields and integer
// arrays (kvm_xsave's trailing flexible array member is zero-sized).
unsafe impl Pod for kvm_regs {}
// SAFETY: as above.
unsafe impl Pod for kvm_sregs {}
// SAFETY: as above.
unsafe impl Pod for kvm_xsave {}
// SAFETY: as above.
unsafe impl Pod for kvm_xcrs {}
// SAFETY: as above.
unsafe impl Pod for kvm_debugregs {}
// SAFETY: as above.
unsafe impl Pod for kvm_lapic_state {}
// SAFETY: as above.
unsafe impl Pod for kvm_vcpu_events {}
// SAFETY: as above.
unsafe impl Pod for kvm_mp_state {}
// SAFETY: as above.
unsafe impl Pod for kvm_irqchip {}
// SAFETY: as above.
unsafe impl Pod for kvm_pit_state2 {}
// SAFETY: as above.
unsafe impl Pod for kvm_clock_data {}

/// A KVM structure serialized as base64 of its bytes.
#[derive(Default)]
pub struct Blob<T: Pod>(pub T);

impl<T: Pod> Clone for Blob<T> {
    fn clone(&self) -> Self {
        Self::from_bytes(self.bytes()).expect("same size")
    }
}

impl<T: Pod> fmt::Debug for Blob<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Blob<{}>({} bytes)",
            std::any::type_name::<T>(),
            std::mem::size_of::<T>()
        )
    }
}

impl<T: Pod> PartialEq for Blob<T> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl<T: Pod> Blob<T> {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `T: Pod` is plain data of size_of::<T>() bytes; reading them as u8 is valid.
        unsafe {
            std::slice::from_raw_parts((&self.0 as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
    }

    /// From exactly `size_of::<T>()` bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != std::mem::size_of::<T>() {
            return None;
        }
        let mut v = T::default();
        // SAFETY: `v` is a valid T we own of exactly b.len() bytes, and every bit pattern is a
        // valid T (`Pod`); the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), (&mut v as *mut T).cast::<u8>(), b.len())
        };
        Some(Self(v))
    }
}

impl<T: Pod> Serialize for Blob<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(self.bytes()))
    }
}

impl<'de, T: Pod> Deserialize<'de> for Blob<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<T: Pod> Visitor<'_> for V<T> {
            type Value = Blob<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "base64 of {} bytes ({})",
                    std::mem::size_of::<T>(),
                    std::any::type_name::<T>()
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                let bytes = STANDARD.decode(s).map_err(E::custom)?;
                Blob::from_bytes(&bytes).ok_or_else(|| {
                    E::custom(format!(
                        "{} is {} bytes, expected {}",
                        std::any::type_name::<T>(),
                        bytes.len(),
                        std::mem::size_of::<T>()
                    ))
                })
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// Arbitrary bytes as base64 (frames, FIFOs).
pub mod bytes {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD.decode(s).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size_checked() {
        let r = kvm_regs {
            rip: 0x1234_5678,
            rflags: 2,
            ..Default::default()
        };
        let j = serde_json::to_string(&Blob(r)).unwrap();
        let back: Blob<kvm_regs> = serde_json::from_str(&j).unwrap();
        assert_eq!(back.0.rip, 0x1234_5678);
        assert_eq!(back, Blob(r));
        let e = serde_json::from_str::<Blob<kvm_regs>>("\"AAAA\"").unwrap_err();
        assert!(e.to_string().contains("expected 144"), "{e}");
        assert!(serde_json::from_str::<Blob<kvm_regs>>("\"!!\"").is_err());
    }
}
