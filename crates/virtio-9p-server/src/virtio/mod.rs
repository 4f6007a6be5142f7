// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The virtio-9p device: feature bits, the config space and the request
//! queue.
//!
//! One request through this module: [`RequestQueue::process`] pops a chain
//! with `virtqueue-large` (large policy: up to 32768 descriptors and
//! 128 MiB + 64 KiB per chain, independent of the ring size), wraps its
//! readable and writable parts in [`ChainReader`]/[`ChainWriter`], and
//! starts a coroutine on the [engine](crate::engine) that runs
//! [`Server::handle`](crate::Server::handle). When the coroutine returns,
//! the chain goes to the used ring with the reply's length, and the driver
//! is signalled if event-idx (or the no-notify flag) says so.
//!
//! The ring may be split or packed (`VIRTIO_F_RING_PACKED`, offered in
//! [`DEVICE_FEATURES`]): [`RequestQueue::process_ring`] and
//! [`RequestQueue::complete_ring`] take any
//! [`DeviceRing`](virtqueue_large::DeviceRing), so both layouts share one
//! request path; [`RequestQueue::process`] and [`RequestQueue::complete`]
//! are the same for a split `virtio_queue::Queue`.
//!
//! A Tflush runs through the server like any other request; the server
//! hands it to the engine ([`Blocking::flush`](crate::Blocking::flush)),
//! which cancels the old request and waits for it, so the old chain is
//! back in the used ring before the Rflush (the engine's "Tflush").

mod device;
mod error;
pub(crate) mod io;
mod queue;

pub use device::Device;
pub use error::VirtioError;
pub use io::{ChainReader, ChainWriter};
pub use queue::{RequestQueue, KICK_BUDGET, MAX_IN_FLIGHT_SEGMENTS};

use virtio_bindings::virtio_config::{VIRTIO_F_RING_PACKED, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtqueue_large::ChainLimits;

/// Feature bit: the config space holds a mount tag (`VIRTIO_9P_MOUNT_TAG`
/// of Linux's `virtio_9p.h`, which virtio-bindings 0.2 does not cover).
pub const VIRTIO_9P_MOUNT_TAG: u32 = 0;

/// The virtio features the device offers: the mount tag, indirect
/// descriptors, event-idx, virtio 1.0 and packed rings (the other feature
/// bits come from virtio-bindings).
pub const DEVICE_FEATURES: u64 = (1 << VIRTIO_9P_MOUNT_TAG)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_F_RING_PACKED);

/// Whether `acked` (the driver's features) selects the packed ring layout.
pub(crate) fn packed_ring(acked: u64) -> bool {
    acked & (1 << VIRTIO_F_RING_PACKED) != 0
}

/// Whether `acked` enables indirect descriptors.
#[cfg(any(test, feature = "vhost-user"))]
pub(crate) fn indirect_descriptors(acked: u64) -> bool {
    acked & (1 << VIRTIO_RING_F_INDIRECT_DESC) != 0
}

/// Longest mount tag: the config space (2 + tag bytes) must fit the
/// 256 bytes a vhost-user GET_CONFIG message carries.
pub const MAX_TAG_LEN: usize = 254;

/// Default queue size (in-flight limit): 1024 entries, 8 times QEMU's 128.
pub const DEFAULT_QUEUE_SIZE: u16 = 1024;
/// Largest queue size accepted (the split-ring maximum).
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Descriptors per chain: 32768 data pages (128 MiB of 4 KiB pages) plus
/// the request, the reply header and one spare, so a full 128 MiB msize
/// works with page-sized scatter-gather lists.
pub(crate) const MAX_CHAIN_DESCRIPTORS: u32 = virtqueue_large::LARGE_MAX_DESCRIPTORS + 3;

/// The chain policy of the request queue: the byte cap of
/// `ChainLimits::large()` (128 MiB plus 64 KiB) with
/// [`MAX_CHAIN_DESCRIPTORS`], independent of the ring size, and indirect
/// tables accepted when the driver acked `VIRTIO_RING_F_INDIRECT_DESC`.
pub(crate) fn chain_limits(indirect: bool) -> ChainLimits {
    ChainLimits::large()
        .with_max_descriptors(MAX_CHAIN_DESCRIPTORS)
        .with_indirect(indirect)
}

/// The device config space: `le16 tag_len` followed by the tag bytes (no
/// NUL), as `struct virtio_9p_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceConfig {
    bytes: Vec<u8>,
}

impl DeviceConfig {
    /// The config space for `tag`.
    pub(crate) fn new(tag: &str) -> Result<Self, VirtioError> {
        let t = tag.as_bytes();
        if t.is_empty() || t.len() > MAX_TAG_LEN {
            return Err(VirtioError::TagLength(t.len()));
        }
        if t.contains(&0) {
            return Err(VirtioError::TagNul);
        }
        let mut bytes = Vec::with_capacity(2 + t.len());
        bytes.extend_from_slice(&(t.len() as u16).to_le_bytes());
        bytes.extend_from_slice(t);
        Ok(DeviceConfig { bytes })
    }

    /// The whole config space.
    #[cfg(test)]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// `size` bytes from `offset`; bytes past the end read as zero (a
    /// driver probing a larger config space gets zeros, never an error).
    pub(crate) fn read(&self, offset: u32, size: u32) -> Vec<u8> {
        let size = (size as usize).min(256);
        let mut out = vec![0u8; size];
        let start = offset as usize;
        if start < self.bytes.len() {
            let n = (self.bytes.len() - start).min(size);
            out[..n].copy_from_slice(&self.bytes[start..start + n]);
        }
        out
    }
}

/// Checks a queue size.
pub(crate) fn validate_queue_size(n: u32) -> Result<u16, VirtioError> {
    if n == 0 || n > u32::from(MAX_QUEUE_SIZE) || !n.is_power_of_two() {
        return Err(VirtioError::QueueSize(n));
    }
    Ok(n as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_config_space_layout() {
        let c = DeviceConfig::new("share").unwrap();
        assert_eq!(c.as_bytes(), b"\x05\x00share");
        assert_eq!(c.read(0, 7), b"\x05\x00share".to_vec());
        assert_eq!(c.read(2, 3), b"sha".to_vec());
        assert_eq!(c.read(5, 4), b"re\0\0".to_vec());
        assert_eq!(c.read(100, 2), vec![0, 0]);
    }

    #[test]
    fn test_config_rejects_bad_tags() {
        assert!(matches!(
            DeviceConfig::new(""),
            Err(VirtioError::TagLength(0))
        ));
        let e = DeviceConfig::new(&"x".repeat(255)).unwrap_err();
        assert!(matches!(e, VirtioError::TagLength(255)));
        assert_eq!(e.to_string(), "mount tag must be 1 to 254 bytes, got 255");
        assert!(DeviceConfig::new(&"x".repeat(254)).is_ok());
        assert!(matches!(
            DeviceConfig::new("a\0b"),
            Err(VirtioError::TagNul)
        ));
    }

    #[test]
    fn test_feature_bits() {
        // The numbers of the virtio spec, not only the bindings' names.
        assert_eq!(
            DEVICE_FEATURES,
            1 | (1 << 28) | (1 << 29) | (1 << 32) | (1 << 34)
        );
        assert!(packed_ring(1 << 34));
        assert!(!packed_ring(DEVICE_FEATURES & !(1 << 34)));
        assert!(indirect_descriptors(1 << 28));
        assert!(!indirect_descriptors(1 << 29));
    }

    #[test]
    fn test_queue_size_validation() {
        assert_eq!(validate_queue_size(1024).unwrap(), 1024);
        assert_eq!(validate_queue_size(32768).unwrap(), 32768);
        assert!(matches!(
            validate_queue_size(0),
            Err(VirtioError::QueueSize(0))
        ));
        assert!(validate_queue_size(1000).is_err());
        assert!(validate_queue_size(65536).is_err());
    }

    #[test]
    fn test_limit_errors_name_this_modules_limits() {
        // error.rs spells the limits out, so that it imports nothing from
        // the transports: these keep the two in step.
        assert_eq!(
            VirtioError::TagLength(0).to_string(),
            format!("mount tag must be 1 to {MAX_TAG_LEN} bytes, got 0")
        );
        assert_eq!(
            VirtioError::QueueSize(3).to_string(),
            format!("queue size 3 must be a power of two from 1 to {MAX_QUEUE_SIZE}")
        );
    }
}
