//! virtio-mmio transport and virtio devices.
