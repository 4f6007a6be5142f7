// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user integration: the daemon as crosvm's generic vhost-user
//! frontend (`--vhost-user type=9p,...`) drives it, as read in crosvm's
//! source (never run against a real crosvm). That frontend offers the
//! guest no indirect descriptors and no packed ring, learns the queue
//! count with `GET_QUEUE_NUM`, reads the config space with the `WRITABLE`
//! flag set, and offers 32768-entry queues unless told `max-queue-size`;
//! a Linux guest then sends each Tread's pages as a direct chain in the
//! ring.
//! crosvm (like QEMU) also splits large guest RAM into regions around the
//! PCI hole, so guest buffers may lie in either region.

mod vhost_user_support;

use std::time::Duration;

use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vhost_user_support::scenarios::attach_open;
use vm_memory::{Bytes, GuestAddress};

use vhost_user_support::*;
use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtqueue_large::mock::UsedEntry;

#[test]
fn test_crosvm_style_frontend_reads_through_direct_chains() {
    let d = TestDaemon::start(2);
    let msize = 512_000u32;
    let data: Vec<u8> = (0..3 * msize).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.dir.path().join("f"), &data).unwrap();
    let mut vmm = d.connect({
        let mut o = VmmOptions::default();
        o.indirect = false;
        o
    });
    assert_eq!(vmm.features() & (1 << 28), 0, "indirect descriptors acked");
    assert_eq!(vmm.frontend().get_queue_num().unwrap(), 1);
    let (_, tag) = vmm
        .frontend()
        .get_config(0, 7, VhostUserConfigFlags::WRITABLE, &[0u8; 7])
        .unwrap();
    assert_eq!(tag, b"\x05\x00share");

    assert_eq!(version(&mut vmm, msize), msize);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    // Rread of msize - 24 bytes: the reply (11-byte header + data) spread
    // over 126 page-sized descriptors, plus the request's, in the ring.
    let count = msize - IOHDRSZ;
    for (t, offset) in [(10u16, 0u64), (11, u64::from(count))] {
        let req = frame(
            t,
            Tmessage::Read(Tread {
                fid: 1,
                offset,
                count,
            }),
        );
        let reply = vmm
            .call(&req, 11 + count, Layout::Chain { seg: 4096 })
            .unwrap();
        assert_eq!(reply.len(), 11 + count as usize);
        check(&reply, &data, offset, count);
    }
    drop(vmm);
    d.stop();
}

/// The features crosvm's generic frontend lets through to the guest
/// (`VhostUserFrontend::new` in
/// `devices/src/virtio/vhost_user_frontend/mod.rs`): the device-specific
/// bits 0-23 and 50-63 (`VIRTIO_DEVICE_TYPE_SPECIFIC_FEATURES_MASK`), its
/// `base_features` (`VIRTIO_F_VERSION_1`, `VIRTIO_RING_F_EVENT_IDX`,
/// `VIRTIO_F_SUSPEND`), and `VHOST_USER_F_PROTOCOL_FEATURES` toward the
/// backend. Never `VIRTIO_RING_F_INDIRECT_DESC` (28) or
/// `VIRTIO_F_RING_PACKED` (34).
const CROSVM_ALLOWED: u64 = 0xfffc_0000_00ff_ffff | (1 << 32) | (1 << 29) | (1 << 42) | (1 << 30);

#[test]
fn test_crosvm_default_negotiation_on_a_32768_entry_ring() {
    // crosvm without max-queue-size offers 32768-entry queues; the daemon
    // takes them when started with --queue-size 32768. It offers packed
    // rings (no --no-packed-ring), which crosvm filters out.
    let d = TestDaemon::start_with(2, 32768, OffloadPolicy::Auto);
    let mut vmm = d.connect({
        let mut o = VmmOptions::default();
        o.queue_size = 32768;
        o.indirect = false;
        o.packed = false;
        o
    });
    let offered = vmm.frontend().get_features().unwrap();
    assert_ne!(offered & (1 << 34), 0, "the daemon offers packed rings");
    let acked = vmm.features();
    assert_eq!(acked, offered & CROSVM_ALLOWED, "crosvm would ack more");
    assert_ne!(acked & 1, 0, "VIRTIO_9P_MOUNT_TAG not acked");
    assert_eq!(acked & (1 << 32), 1 << 32, "VERSION_1 not acked");
    assert_eq!(acked & (1 << 28 | 1 << 34), 0, "indirect or packed acked");
    assert!(!vmm.is_packed());

    // 8 MiB msize: the Rread goes out as one direct chain of 2048 page
    // descriptors plus the request's, more than a 1024-entry ring holds.
    let msize = 8u32 << 20;
    let data: Vec<u8> = (0..msize).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.dir.path().join("big"), &data).unwrap();
    assert_eq!(version(&mut vmm, msize), msize);
    attach_open(&mut vmm, "big", OpenFlags::RDONLY);
    let count = msize - IOHDRSZ;
    let req = frame(
        40,
        Tmessage::Read(Tread {
            fid: 1,
            offset: 0,
            count,
        }),
    );
    let reply = vmm
        .call(&req, 11 + count, Layout::Chain { seg: 4096 })
        .unwrap();
    assert_eq!(reply.len(), 11 + count as usize);
    check(&reply, &data, 0, count);
    drop(vmm);
    d.stop();
}

#[test]
fn test_queue_larger_than_queue_size_is_refused() {
    // crosvm's default max-queue-size is 32768; the daemon (queue size
    // 1024) must refuse it rather than accept a ring it cannot serve.
    let d = TestDaemon::start(2);
    let mut vmm = d.connect(VmmOptions::default());
    vmm.frontend().set_vring_num(0, 1024).unwrap();
    assert!(vmm.frontend().set_vring_num(0, 32768).is_err());
    drop(vmm);
    d.stop();
}

/// Submits a Tread of `count` bytes at `offset` of fid 1 with a reply
/// buffer of `reply_len` bytes at `reply_addr` (the request goes to the
/// allocator's first region) and kicks; returns the chain's head.
fn submit_read(
    vmm: &mut FakeVmm,
    tag: u16,
    (offset, count): (u64, u32),
    (reply_addr, reply_len): (u64, u32),
    layout: Layout,
) -> u16 {
    let req = frame(
        tag,
        Tmessage::Read(Tread {
            fid: 1,
            offset,
            count,
        }),
    );
    let req_addr = vmm.alloc(req.len() as u64).unwrap();
    vmm.memory()
        .write_slice(&req, GuestAddress(req_addr))
        .unwrap();
    let sub = vmm
        .submit_at(req_addr, req.len() as u32, reply_addr, reply_len, layout, 0)
        .unwrap();
    vmm.kick().unwrap();
    sub.head
}

/// Reads `count` bytes at `offset` of fid 1 into a reply buffer at
/// `reply_addr` and returns the reply.
fn read_into(
    vmm: &mut FakeVmm,
    tag: u16,
    offset: u64,
    count: u32,
    reply_addr: u64,
    layout: Layout,
) -> Vec<u8> {
    let head = submit_read(vmm, tag, (offset, count), (reply_addr, 11 + count), layout);
    let used = vmm.wait_used(Duration::from_secs(30)).unwrap();
    assert_eq!(
        used,
        vec![UsedEntry {
            id: u32::from(head),
            len: 11 + count
        }]
    );
    vmm.read(reply_addr, (11 + count) as usize).unwrap()
}

fn check(reply: &[u8], data: &[u8], offset: u64, count: u32) {
    assert_eq!(reply[4], MsgType::Rread);
    assert_eq!(&reply[7..11], &count.to_le_bytes());
    let at = offset as usize;
    assert!(
        reply[11..] == data[at..at + count as usize],
        "data at {offset} differs"
    );
}

#[test]
fn test_reads_into_both_memory_regions_around_a_hole() {
    let d = TestDaemon::start(2);
    let data: Vec<u8> = (0..1_200_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(d.dir.path().join("f"), &data).unwrap();
    // 16 MiB at guest address 0, 16 MiB more above a 256 MiB hole.
    let (at, hole) = (16u64 << 20, 256u64 << 20);
    let mut vmm = d.connect({
        let mut o = VmmOptions::default();
        o.mem_size = 32 << 20;
        o.indirect = false;
        o.split = Some((at, hole));
        o
    });
    version(&mut vmm, 512_000);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    let count = 512_000 - IOHDRSZ;
    // Below the hole, then above it (page-sized direct chains).
    let low = read_into(&mut vmm, 20, 0, count, 8 << 20, Layout::Chain { seg: 4096 });
    check(&low, &data, 0, count);
    let high_addr = at + hole + (4 << 20);
    let high = read_into(
        &mut vmm,
        21,
        4096,
        count,
        high_addr,
        Layout::Chain { seg: 4096 },
    );
    check(&high, &data, 4096, count);
    // An address inside the hole is refused and the queue keeps serving.
    let head = submit_read(
        &mut vmm,
        22,
        (0, 4096),
        (at + 4096, 4096 + 11),
        Layout::Direct,
    );
    assert_eq!(
        vmm.wait_used(Duration::from_secs(30)).unwrap(),
        vec![UsedEntry {
            id: u32::from(head),
            len: 0
        }]
    );
    let again = read_into(&mut vmm, 23, 0, 4096, high_addr, Layout::Direct);
    check(&again, &data, 0, 4096);
    drop(vmm);
    d.stop();
}

#[test]
fn test_read_into_a_buffer_spanning_two_adjacent_regions() {
    let d = TestDaemon::start(2);
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 239) as u8).collect();
    std::fs::write(d.dir.path().join("f"), &data).unwrap();
    let at = 16u64 << 20;
    let mut vmm = d.connect({
        let mut o = VmmOptions::default();
        o.mem_size = 32 << 20;
        o.split = Some((at, 0));
        o
    });
    version(&mut vmm, 512_000);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    // One descriptor of 11 + count bytes, half in each region: two
    // mappings in the daemon, one guest buffer.
    let count = 512_000 - IOHDRSZ;
    let reply_addr = at - 256 * 1024;
    let reply = read_into(&mut vmm, 30, 100, count, reply_addr, Layout::Direct);
    check(&reply, &data, 100, count);
    drop(vmm);
    d.stop();
}
