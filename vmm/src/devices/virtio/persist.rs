//! What every virtio device's snapshot shares: the common part of its state ([`CommonState`]),
//! how a freshly built device takes it ([`restore_state`]), and the error every device's restore
//! can meet ([`FeaturesError`]). Each device's `persist.rs` holds the rest, the transport's is
//! `mmio/persist.rs`; the device manager (`device_manager/persist.rs`) puts them together.

use super::VirtioDevice;

/// What every device saves of its common part in a snapshot. (The devices' saved structs carry
/// these fields in their own places: the snapshot format 1.x fixes their JSON layout.) Queue
/// positions and the interrupt status are the transport's part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonState {
    pub avail_features: u64,
    pub acked_features: u64,
    /// The broken flag (the driver sees DEVICE_NEEDS_RESET).
    pub needs_reset: bool,
}

/// A saved state whose acked features the restored device does not offer (its backend lacks
/// an offload the guest uses).
#[derive(Debug, thiserror::Error)]
#[error("{what} does not offer features {acked:#x} the guest acked (offers {offered:#x})")]
pub struct FeaturesError {
    pub what: String,
    pub acked: u64,
    pub offered: u64,
}

/// Gives a freshly built `dev` the saved common state: the acked features (which `dev` must
/// offer; `what` names it in the error) through [`VirtioDevice::set_acked_features`], so a
/// device that configures its backend from them does so, and the broken flag. The offered
/// features are the new backend's, not the saved ones.
pub fn restore_state<D: VirtioDevice + ?Sized>(
    dev: &mut D,
    what: &str,
    saved: CommonState,
) -> Result<(), FeaturesError> {
    let offered = dev.common().avail_features();
    if saved.acked_features & !offered != 0 {
        return Err(FeaturesError {
            what: what.to_string(),
            acked: saved.acked_features,
            offered,
        });
    }
    dev.set_acked_features(saved.acked_features);
    dev.common_mut().set_broken(saved.needs_reset);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::VIRTIO_F_VERSION_1;

    #[test]
    fn restore_takes_offered_acked_features_and_the_broken_flag() {
        use crate::devices::virtio::test_utils::DummyDevice;
        let mut d = DummyDevice::new(&[8]);
        let saved = CommonState {
            avail_features: 0,
            acked_features: 1 << VIRTIO_F_VERSION_1,
            needs_reset: true,
        };
        restore_state(&mut d, "dev", saved).unwrap();
        let st = d.common.state();
        assert_eq!(st.acked_features, 1 << VIRTIO_F_VERSION_1);
        assert!(st.needs_reset);
        // The offered features are the device's own.
        assert_eq!(st.avail_features, (1 << VIRTIO_F_VERSION_1) | (1 << 3));
        let e = restore_state(
            &mut DummyDevice::new(&[8]),
            "dev",
            CommonState {
                acked_features: 2,
                ..saved
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "dev does not offer features 0x2 the guest acked (offers {:#x})",
                (1u64 << VIRTIO_F_VERSION_1) | (1 << 3)
            )
        );
    }
}
