// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Strictly validated virtio descriptor chains of up to 32768 descriptors,
//! with zero-copy, `IOV_MAX`-chunked file I/O.
//!
//! Virtio ties the descriptors per request to the queue size, so a 9p or
//! block device cannot move more than a few MiB per request. This crate
//! keeps the ring small and lets one chain carry up to 32768 descriptors
//! (128 MiB of 4 KiB pages) under an explicit policy, reports every chain
//! fault as an [`Error`] instead of ending the chain silently, and splits
//! file I/O at [`IOV_MAX`] so host syscalls never see too many iovecs
//! (buffers adjacent in host memory share one iovec).
//!
//! It sits on virtio-queue: `virtio_queue::Queue` (or the queue inside a
//! vhost-user-backend vring) keeps the rings, event-idx and notification
//! state; this crate replaces the chain walk.
//!
//! - [`ChainLimits`]: the policy. [`ChainLimits::strict`] (the default)
//!   allows queue-size descriptors; [`ChainLimits::large`] allows 32768
//!   descriptors and 128 MiB + 64 KiB whatever the ring size.
//! - [`ChainWalker`]: pops the next chain from a queue, validates it and
//!   returns a [`Chain`]; a bad chain is logged (rate-limited), returned to
//!   the driver with length 0, and reported as an [`Error`].
//! - [`Chain`]: owns its memory handle; gives a [`Reader`] over the
//!   device-readable part and a [`Writer`] over the device-writable part,
//!   with `read_obj`/`write_obj`, `split_at`, `std::io::Read`/`Write`, and
//!   zero-copy [`Writer::read_from_file_at`] (`preadv`) /
//!   [`Reader::write_to_file_at`] (`pwritev`).
//! - [`PackedQueue`], popped with [`DeviceRing::pop_chain`]: packed
//!   virtqueues (`VIRTIO_F_RING_PACKED`) under the same policies, with
//!   the same [`Chain`], [`Reader`]/[`Writer`] and errors: wrap counters,
//!   buffer ids returned in any order, packed indirect tables, event
//!   suppression with event-idx, and the vhost-user ring base ([`packed`]).
//! - [`DeviceRing`] (with [`AnyRing`] and [`SplitRing`]): one request path
//!   for split and packed rings.
//! - [`ChainWalker::adopt`]: a [`Chain`] from a `virtio_queue::DescriptorChain`
//!   a VMM already popped; [`Reader::iovecs`]/[`Writer::iovecs`]: an
//!   [`IoVecs`] view of the remaining buffers for io_uring or AIO backends.
//! - `mock` (feature `test-utils`): driver-side mocks that lay out direct,
//!   indirect, 32768-descriptor and malicious chains in a real
//!   `GuestMemoryMmap`, `MockDriver` for split rings and
//!   `MockPackedDriver` for packed ones.
//!
//! # Example
//!
//! A device loop: pop, serve, add to the used ring, signal if needed.
//!
//! ```
//! use std::io::{Read, Write};
//! use virtio_queue::QueueT;
//! use virtqueue_large::mock::{guest_memory, Layout, MockDriver, UsedEntry};
//! use virtqueue_large::{ChainLimits, ChainWalker};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mem = guest_memory(1 << 20);
//! let mut driver = MockDriver::new(&mem, 16);
//! let mut queue = driver.create_queue();
//! queue.set_event_idx(true);
//! driver.add_chain_with_data(Layout::Indirect, &[b"ping"], &[16])?;
//!
//! let mut walker = ChainWalker::new(ChainLimits::large())?;
//! loop {
//!     queue.disable_notification(&mem)?;
//!     loop {
//!         let chain = match walker.pop(&mut queue, &mem) {
//!             Ok(Some(chain)) => chain,
//!             Ok(None) => break,
//!             // Already logged and returned to the driver: keep going.
//!             Err(e) if e.is_chain_fault() => continue,
//!             // The ring itself is broken: stop using the queue.
//!             Err(e) => return Err(e.into()),
//!         };
//!         let (mut reader, mut writer) = (chain.reader(), chain.writer());
//!         let mut request = Vec::new();
//!         reader.read_to_end(&mut request)?;
//!         writer.write_all(b"pong")?;
//!         queue.add_used(&mem, chain.head_index(), writer.bytes_written() as u32)?;
//!     }
//!     if queue.needs_notification(&mem)? {
//!         // signal the used-buffer notification (irqfd / call eventfd)
//!     }
//!     if !queue.enable_notification(&mem)? {
//!         break;
//!     }
//! }
//! assert_eq!(driver.take_used(), vec![UsedEntry { id: 0, len: 4 }]);
//! # Ok(())
//! # }
//! ```
//!
//! The same loop serves packed rings through [`DeviceRing`]:
//!
//! ```
//! use std::io::Write;
//! use virtqueue_large::mock::{guest_memory, Layout, MockPackedDriver, UsedEntry};
//! use virtqueue_large::{ChainLimits, ChainWalker, DeviceRing};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mem = guest_memory(1 << 20);
//! let mut driver = MockPackedDriver::new(&mem, 16);
//! let mut queue = driver.create_queue();
//! driver.add_chain_with_data(Layout::Indirect, &[b"ping"], &[16])?;
//! let mut walker = ChainWalker::new(ChainLimits::large())?;
//! while let Some(chain) = queue.pop_chain(&mut walker, &mem)? {
//!     let mut writer = chain.writer();
//!     writer.write_all(b"pong")?;
//!     queue.push_used(&mem, chain.head_index(), writer.bytes_written() as u32)?;
//! }
//! assert_eq!(driver.take_used(), vec![UsedEntry { id: 0, len: 4 }]);
//! # Ok(())
//! # }
//! ```
//!
//! # Validation
//!
//! The walk reads every descriptor itself from guest memory (once, into a
//! local copy) and refuses, with one [`Error`] variant each: loops (more
//! visits than the table has entries), `next` out of range, buffers or
//! tables outside guest memory, more than 2^32 - 1 bytes or more than
//! `max_bytes`, more than `max_descriptors`, readable after writable,
//! nested indirect tables, indirect tables whose length is not a multiple
//! of 16, zero or above 65535 entries, INDIRECT together with NEXT, indirect
//! descriptors when not negotiated, head indices out of range and a bad
//! available index. Unlike virtio-queue's iterator, entering an indirect
//! table does not reset the descriptor budget.
//!
//! Zero-length descriptors are accepted and counted; they add no segment.
//! Direct descriptors may precede the indirect one in the ring (the device
//! requirement of virtio 1.2, 2.7.5.3.2). The WRITE flag of a descriptor
//! that points at a table is ignored, as the specification requires.
//!
//! # Chained indirect tables (proposed extension)
//!
//! With the `chained-indirect` cargo feature and
//! [`ChainLimits::chained_indirect`] set, the last descriptor of an
//! indirect table's chain may itself carry `VIRTQ_DESC_F_INDIRECT` (and no
//! NEXT) to continue the chain in a further table. This is *not* part of
//! the virtio specification: it is the idea discussed with the 2021
//! qemu-devel thread "virtio: increase VIRTQUEUE_MAX_SIZE to 32k" and the
//! still-open virtio-spec issue #122, which lets a driver describe 32k
//! pages with page-sized tables instead of one 512 KiB table. Each link
//! counts against `max_descriptors`, so tables that link back to
//! themselves end in [`Error::TooManyDescriptors`]. Without the feature,
//! asking for it is refused by [`ChainLimits::validate`].
//!
//! # Public dependencies
//!
//! virtio-queue and vm-memory types appear in the API on purpose: the
//! walker pops from any `virtio_queue::QueueT` (the queue a VMM or
//! vhost-user-backend already has), adopts a `virtio_queue::DescriptorChain`,
//! and reads guest memory through vm-memory's `GuestMemoryBackend`, so that
//! a device keeps its own queue and memory types. Both are thus public
//! dependencies: a breaking release of either (this crate uses 0.18) is a
//! breaking release of this crate.

#![cfg_attr(docsrs, feature(doc_cfg))]

// The README is the crate's crates.io page: its example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctest {}

mod error;
mod io;
mod limits;
pub mod packed;
mod ring;
mod segments;
mod walk;

#[cfg(any(test, feature = "test-utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod fuzzing;
#[cfg(any(test, feature = "test-utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod mock;

pub use crate::error::{Error, ErrorKind, Result};
pub use crate::io::{IoVecs, Reader, Writer, IOV_MAX, MAX_RW_COUNT};
pub use crate::limits::{
    ChainLimits, DescriptorLimit, LARGE_MAX_BYTES, LARGE_MAX_DESCRIPTORS, MAX_DESCRIPTORS,
    MAX_TABLE_ENTRIES,
};
pub use crate::packed::PackedQueue;
pub use crate::ring::{AnyRing, DeviceRing, SplitRing};
pub use crate::segments::{Segment, MAX_POOLED_SEGMENTS};
pub use crate::walk::{Chain, ChainWalker, WalkerStats, DEFAULT_POOL_SIZE, LOG_BURST, LOG_WINDOW};
