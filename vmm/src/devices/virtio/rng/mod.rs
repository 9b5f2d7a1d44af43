//! virtio-rng (virtio 1.2, 5.4): entropy for the guest from the host's `getrandom`.
//!
//! - `queue.rs`: pure request handling (fill the guest's writable buffers) and the token
//!   bucket that limits how fast the guest can draw;
//! - `device.rs`: the [`VirtioDevice`](super::VirtioDevice) (no config space, no feature bits
//!   besides VERSION_1); `event_handler.rs`: event-loop glue (queue ioeventfd and the timer
//!   that resumes a throttled queue); `persist.rs`: snapshot state.
//!
//! Rate limit: a token bucket of [`BURST_BYTES`] refilled at [`BYTES_PER_SEC`]. Linux's
//! hwrng core draws a few dozen bytes at a time and sleeps while its pool is full, so a guest
//! never notices; a guest reading `/dev/hwrng` in a loop gets [`BYTES_PER_SEC`] and costs the
//! host about a millisecond of CPU per second. A chain gets at most the tokens available
//! (a short answer is valid); with none left, chains wait in the ring until the timer fires.

pub mod device;
pub mod event_handler;
pub mod persist;
pub mod queue;

use serde::{Deserialize, Serialize};

pub use device::RngDevice;

/// Bytes the guest can draw per second, sustained.
pub const BYTES_PER_SEC: u64 = 1 << 20;
/// Bytes the guest can draw at once after being idle.
pub const BURST_BYTES: u64 = 64 << 10;

/// `--rng` / JSON `"rng": {}`: the VM gets a virtio-rng device (KubeVirt's
/// `spec.domain.devices.rng: {}`). It has no options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngConfig {}
