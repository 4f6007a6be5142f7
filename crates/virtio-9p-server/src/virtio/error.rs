// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The virtio device's own errors. The crate's [`Error`](crate::Error)
//! wraps them ([`Error::Virtio`](crate::Error::Virtio)); nothing here
//! imports it back.

use std::io;

/// What the virtio device refused, or the ring it could not use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VirtioError {
    /// The mount tag is empty or longer than
    /// [`MAX_TAG_LEN`](super::MAX_TAG_LEN) (254; its tests pin the number
    /// in this message).
    #[error("mount tag must be 1 to 254 bytes, got {0}")]
    TagLength(usize),
    /// The mount tag contains a NUL byte.
    #[error("mount tag must not contain NUL bytes")]
    TagNul,
    /// The queue size is zero, above
    /// [`MAX_QUEUE_SIZE`](super::MAX_QUEUE_SIZE) (32768; its tests pin the
    /// number in this message) or not a power of two.
    #[error("queue size {0} must be a power of two from 1 to 32768")]
    QueueSize(u32),
    /// The driver (or the VMM) asked the device for something its state
    /// does not allow: features acked twice or after activation,
    /// activation without acked features or with a ring that is not set
    /// up, a snapshot of a running device, a damaged snapshot.
    #[error("virtio device: {0}")]
    DeviceState(&'static str),
    /// The descriptor chain policy is invalid.
    #[error("chain policy: {0}")]
    ChainLimits(#[source] virtqueue_large::Error),
    /// The ring itself is broken (bad available index, unreadable ring);
    /// the queue stops until the driver resets it.
    #[error("virtqueue is broken: {0}")]
    Ring(#[source] virtqueue_large::Error),
    /// Writing the used ring failed.
    #[error("cannot add to the used ring: {0}")]
    Used(#[source] virtqueue_large::Error),
    /// The eventfd that resumes a queue left with work could not be made.
    #[error("cannot create the queue's resume eventfd: {0}")]
    ResumeFd(#[source] io::Error),
}
