// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The chain policy.

use crate::{Error, Result};

/// The most descriptors one indirect table can address (16-bit indices).
pub const MAX_TABLE_ENTRIES: u32 = u16::MAX as u32;

/// The most descriptors any policy may allow in one chain.
pub const MAX_DESCRIPTORS: u32 = MAX_TABLE_ENTRIES;

/// Descriptors per chain under [`ChainLimits::large`]: 128 MiB of 4 KiB pages.
pub const LARGE_MAX_DESCRIPTORS: u32 = 32768;

/// Bytes per chain under [`ChainLimits::large`]: 128 MiB of payload plus 64 KiB for headers.
pub const LARGE_MAX_BYTES: u32 = (128 << 20) + (64 << 10);

/// How many descriptors one chain may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DescriptorLimit {
    /// The queue size, as the virtio specification requires (spec-strict).
    QueueSize,
    /// A fixed count, independent of the ring size (1 to [`MAX_DESCRIPTORS`]).
    Count(u32),
}

/// The policy a chain is validated against.
///
/// The default is spec-strict: at most queue-size descriptors, direct or
/// through one indirect table, and the 2^32 - 1 bytes virtio allows.
/// [`ChainLimits::large`] keeps the ring small but lets one chain carry
/// [`LARGE_MAX_DESCRIPTORS`] descriptors (raise it up to
/// [`MAX_DESCRIPTORS`], what a single indirect table can address) and caps
/// the bytes at [`LARGE_MAX_BYTES`].
///
/// What is counted: every descriptor that describes a buffer (zero-length
/// ones included), and with `chained_indirect` every link to a further
/// table. The descriptor in the ring that points at an indirect table is not
/// counted, so a 32768-entry table fits a 32768-descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChainLimits {
    /// Descriptors per chain.
    pub max_descriptors: DescriptorLimit,
    /// Bytes per chain, readable and writable together.
    pub max_bytes: u32,
    /// Accept `VIRTQ_DESC_F_INDIRECT` (the device offered
    /// `VIRTIO_F_INDIRECT_DESC`).
    pub indirect: bool,
    /// Accept an indirect table whose last descriptor links to a further
    /// table. This is a proposed extension of the virtio specification, not
    /// part of it; it needs the `chained-indirect` cargo feature, see the
    /// crate documentation.
    pub chained_indirect: bool,
}

impl Default for ChainLimits {
    fn default() -> Self {
        Self::strict()
    }
}

impl ChainLimits {
    /// Spec-strict: at most queue-size descriptors, indirect tables
    /// accepted, no byte cap beyond the 32-bit total.
    pub const fn strict() -> Self {
        ChainLimits {
            max_descriptors: DescriptorLimit::QueueSize,
            max_bytes: u32::MAX,
            indirect: true,
            chained_indirect: false,
        }
    }

    /// Large requests independent of the ring size:
    /// [`LARGE_MAX_DESCRIPTORS`] descriptors and [`LARGE_MAX_BYTES`] bytes.
    pub const fn large() -> Self {
        ChainLimits {
            max_descriptors: DescriptorLimit::Count(LARGE_MAX_DESCRIPTORS),
            max_bytes: LARGE_MAX_BYTES,
            indirect: true,
            chained_indirect: false,
        }
    }

    /// The same limits with another descriptor count.
    pub const fn with_max_descriptors(mut self, max: u32) -> Self {
        self.max_descriptors = DescriptorLimit::Count(max);
        self
    }

    /// The same limits with another byte cap.
    pub const fn with_max_bytes(mut self, max: u32) -> Self {
        self.max_bytes = max;
        self
    }

    /// The same limits with indirect descriptors accepted or refused.
    pub const fn with_indirect(mut self, indirect: bool) -> Self {
        self.indirect = indirect;
        self
    }

    /// The same limits with chained indirect tables accepted or refused
    /// (needs the `chained-indirect` feature to be accepted).
    pub const fn with_chained_indirect(mut self, chained: bool) -> Self {
        self.chained_indirect = chained;
        self
    }

    /// Checks that the limits make sense and that the features they need are
    /// compiled in.
    pub fn validate(&self) -> Result<()> {
        if let DescriptorLimit::Count(n) = self.max_descriptors {
            if n == 0 {
                return Err(Error::InvalidLimits("max_descriptors must be at least 1"));
            }
            if n > MAX_DESCRIPTORS {
                return Err(Error::InvalidLimits("max_descriptors above 65535"));
            }
        }
        if self.chained_indirect && !cfg!(feature = "chained-indirect") {
            return Err(Error::InvalidLimits(
                "chained_indirect needs the chained-indirect cargo feature",
            ));
        }
        if self.chained_indirect && !self.indirect {
            return Err(Error::InvalidLimits("chained_indirect needs indirect"));
        }
        Ok(())
    }

    /// The descriptor limit for a queue of `queue_size` entries.
    pub fn descriptors_for(&self, queue_size: u16) -> u32 {
        match self.max_descriptors {
            DescriptorLimit::QueueSize => u32::from(queue_size),
            DescriptorLimit::Count(n) => n,
        }
    }

    pub(crate) fn chained(&self) -> bool {
        cfg!(feature = "chained-indirect") && self.chained_indirect
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_default_is_strict() {
        let l = ChainLimits::default();
        assert_eq!(l.descriptors_for(256), 256);
        assert_eq!(l.max_bytes, u32::MAX);
        assert!(l.validate().is_ok());
    }

    #[test]
    fn test_large_is_independent_of_queue_size() {
        let l = ChainLimits::large();
        assert_eq!(l.descriptors_for(16), 32768);
        assert_eq!(l.descriptors_for(1024), 32768);
        assert_eq!(l.max_bytes, (128 << 20) + (64 << 10));
    }

    #[test]
    fn test_validate_rejects_bad_counts() {
        let msg = ChainLimits::large()
            .with_max_descriptors(0)
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "invalid chain limits: max_descriptors must be at least 1"
        );
        assert!(ChainLimits::large()
            .with_max_descriptors(65536)
            .validate()
            .is_err());
        assert!(ChainLimits::large()
            .with_max_descriptors(65535)
            .validate()
            .is_ok());
    }

    #[test]
    fn test_chained_indirect_needs_feature_and_indirect() {
        let l = ChainLimits::large().with_chained_indirect(true);
        assert_eq!(l.validate().is_ok(), cfg!(feature = "chained-indirect"));
        let l = l.with_indirect(false);
        assert!(l.validate().is_err());
    }
}
