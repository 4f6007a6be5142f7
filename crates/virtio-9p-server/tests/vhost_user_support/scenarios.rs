// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The heavy vhost-user scenarios, shared by the in-process daemon
//! (`vhost_user_requests.rs`) and the hardened binary
//! (`sandbox_vhost_user.rs`). Each writes its files under `dir` (the
//! export), connects through `connect` with the ring layout `ring`
//! (split or packed: every scenario runs on both) and drops its `FakeVmm`
//! before it returns, so the caller can then stop its daemon.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::DEFAULT_MAX_LOCK_WAITERS;
use virtqueue_large::mock::{Malicious, PackedMalicious, UsedEntry};

use super::{decode, frame, version};

/// The ring layout a scenario drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    Split,
    Packed,
}

impl Ring {
    /// `opts` with this layout.
    pub fn opts(self, mut opts: VmmOptions) -> VmmOptions {
        opts.packed = self == Ring::Packed;
        opts
    }
}

/// Takes or drops an OFD lock on the whole file (conflicts with the
/// daemon's OFD locks even in the same process).
pub fn ofd_lock(file: &std::fs::File, ty: i32) {
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: a valid fd and flock pointer for the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

/// Opens `path` read-write and takes an OFD write lock on it: a lock the
/// host holds, which every guest Tlock meets.
pub fn hold_lock(path: &Path) -> std::fs::File {
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    ofd_lock(&holder, libc::F_WRLCK);
    holder
}

/// Tattach as fid 0 (uname root).
pub fn attach(vmm: &mut FakeVmm) {
    let attach = Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    assert!(matches!(
        decode(&vmm.call(&frame(1, attach), 64, Layout::Direct).unwrap()).1,
        Rmessage::Attach(_)
    ));
}

/// Tattach as fid 0, Twalk to `name` as fid 1, Tlopen fid 1 with `flags`.
pub fn attach_open(vmm: &mut FakeVmm, name: &str, flags: OpenFlags) {
    vmm.open_file(None, name, flags).unwrap();
}

/// Up to 64 bytes of fid 1 from offset 0 (a direct chain).
fn read_fid1(vmm: &mut FakeVmm) -> Vec<u8> {
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 64,
    });
    let r = vmm.call(&frame(9, read), 128, Layout::Direct).unwrap();
    match decode(&r).1 {
        Rmessage::Read(data) => data,
        other => panic!("Tread answered {other:?}"),
    }
}

/// A 128 MiB Tread through one indirect chain of 32768 data descriptors.
pub fn read_128m_through_indirect_chain(
    dir: &Path,
    connect: impl FnOnce(VmmOptions) -> FakeVmm,
    ring: Ring,
) {
    let size = 128usize << 20;
    let mut data = vec![0u8; size];
    for (i, chunk) in data.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    }
    std::fs::write(dir.join("big"), &data).unwrap();
    let mut vmm = connect(ring.opts({
        let mut o = VmmOptions::default();
        o.mem_size = 140 << 20;
        o.queue_size = 1024;
        o
    }));
    assert_eq!(vmm.is_packed(), ring == Ring::Packed);
    assert_eq!(version(&mut vmm, MAX_MSIZE), MAX_MSIZE);
    attach_open(&mut vmm, "big", OpenFlags::RDONLY);
    // Rread header (11 bytes) + 128 MiB - 11 in 32768 writable descriptors
    // of 4 KiB: 4096 * 32768 = 128 MiB exactly.
    let count = MAX_MSIZE - 11;
    let sub = vmm
        .submit(
            &frame(
                4,
                Tmessage::Read(Tread {
                    fid: 1,
                    offset: 0,
                    count,
                }),
            ),
            MAX_MSIZE,
            Layout::Indirect { seg: 4096 },
        )
        .unwrap();
    vmm.kick().unwrap();
    let used = vmm.wait_used(Duration::from_secs(60)).unwrap();
    assert_eq!(
        used,
        vec![UsedEntry {
            id: u32::from(sub.head),
            len: MAX_MSIZE
        }]
    );
    let reply = vmm.read(sub.reply_addr, MAX_MSIZE as usize).unwrap();
    assert_eq!(&reply[..4], &MAX_MSIZE.to_le_bytes());
    assert_eq!(reply[4], MsgType::Rread);
    assert_eq!(&reply[7..11], &count.to_le_bytes());
    assert!(
        reply[11..] == data[..count as usize],
        "read data differs from the file"
    );
}

/// Treads in flight on a 1024-entry ring: 512 direct chains (two
/// descriptors each, the whole ring), then 1024 indirect chains (one each).
pub fn requests_1024_in_flight(
    dir: &Path,
    connect: impl FnOnce(VmmOptions) -> FakeVmm,
    ring: Ring,
) {
    std::fs::write(dir.join("f"), vec![0x5au8; 4096]).unwrap();
    let mut vmm = connect(ring.opts({
        let mut o = VmmOptions::default();
        o.mem_size = 64 << 20;
        o
    }));
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    for (n, layout) in [
        (512u16, Layout::Direct),
        (1024, Layout::Indirect { seg: 64 }),
    ] {
        for i in 0..n {
            let req = frame(
                10 + i,
                Tmessage::Read(Tread {
                    fid: 1,
                    offset: u64::from(i) % 4000,
                    count: 8,
                }),
            );
            vmm.submit(&req, 64, layout).unwrap();
        }
        assert_eq!(vmm.pending(), usize::from(n));
        vmm.kick().unwrap();
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while got < n && Instant::now() < deadline {
            for u in vmm.wait_used(Duration::from_secs(1)).unwrap() {
                assert_eq!(u.len, 11 + 8);
                got += 1;
            }
        }
        assert_eq!(got, n, "{layout:?}");
        assert_eq!(vmm.pending(), 0);
    }
}

/// 1023 blocking Tlocks on a lock the test holds: the server keeps
/// [`DEFAULT_MAX_LOCK_WAITERS`] of them waiting and answers the rest
/// BLOCKED at once; one waiter is flushed, then the lock is released and
/// every waiter is granted.
pub fn blocked_locks_then_flushed(
    dir: &Path,
    connect: impl FnOnce(VmmOptions) -> FakeVmm,
    ring: Ring,
) {
    let path = dir.join("lockme");
    std::fs::write(&path, b"x").unwrap();
    // Hold an OFD write lock from the test: every guest Tlock blocks.
    let holder = hold_lock(&path);

    let mut vmm = connect(ring.opts({
        let mut o = VmmOptions::default();
        o.mem_size = 64 << 20;
        o
    }));
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    // 1023 blocked Tlocks (indirect: one ring descriptor each), leaving
    // one descriptor for the Tflush.
    let mut subs = Vec::new();
    for tag in 100..1123u16 {
        subs.push(
            vmm.submit(&blocking_lock(tag), 64, Layout::Indirect { seg: 64 })
                .unwrap(),
        );
    }
    vmm.kick().unwrap();
    // Past the per-session cap, BLOCKED at once; the rest wait.
    let blocked_at_once = subs.len() - DEFAULT_MAX_LOCK_WAITERS;
    let mut early = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while early.len() < blocked_at_once && Instant::now() < deadline {
        early.extend(vmm.wait_used(Duration::from_secs(1)).unwrap());
    }
    std::thread::sleep(Duration::from_millis(300));
    early.extend(vmm.collect_used().unwrap());
    assert_eq!(early.len(), blocked_at_once);
    for u in &early {
        let sub = subs.iter().find(|s| u32::from(s.head) == u.id).unwrap();
        let reply = decode(&vmm.read(sub.reply_addr, u.len as usize).unwrap());
        assert_eq!(reply.1, Rmessage::Lock(LockStatus::Blocked), "{reply:?}");
    }
    let waiting: Vec<_> = subs
        .iter()
        .filter(|s| !early.iter().any(|u| u.id == u32::from(s.head)))
        .collect();
    let target = waiting[0];
    let target_tag = 100 + subs.iter().position(|s| s.head == target.head).unwrap() as u16;

    // Flush one waiter: its chain comes back (no reply), then Rflush.
    let flush = vmm
        .submit(
            &frame(5000, Tmessage::Flush(Tflush { oldtag: target_tag })),
            64,
            Layout::Indirect { seg: 64 },
        )
        .unwrap();
    vmm.kick().unwrap();
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while order.len() < 2 && Instant::now() < deadline {
        order.extend(vmm.wait_used(Duration::from_secs(1)).unwrap());
    }
    assert_eq!(order.len(), 2, "{order:?}");
    assert_eq!(
        order[0].id,
        u32::from(target.head),
        "the flushed request must come back first"
    );
    assert_eq!(
        order[1],
        UsedEntry {
            id: u32::from(flush.head),
            len: 7
        }
    );
    let rflush = vmm.read(flush.reply_addr, 7).unwrap();
    assert_eq!(decode(&rflush), (5000, Rmessage::Flush));

    // Release the lock: every waiter is granted and its chain comes back.
    ofd_lock(&holder, libc::F_UNLCK);
    let mut granted = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while granted.len() < waiting.len() - 1 && Instant::now() < deadline {
        granted.extend(vmm.wait_used(Duration::from_secs(1)).unwrap());
    }
    assert_eq!(granted.len(), waiting.len() - 1);
    for u in &granted {
        let sub = subs.iter().find(|s| u32::from(s.head) == u.id).unwrap();
        let reply = decode(&vmm.read(sub.reply_addr, u.len as usize).unwrap());
        assert_eq!(reply.1, Rmessage::Lock(LockStatus::Success), "{reply:?}");
    }
}

/// Malformed chains and 9P messages; the queue keeps serving afterwards.
pub fn malformed_chains_and_messages(
    dir: &Path,
    connect: impl FnOnce(VmmOptions) -> FakeVmm,
    ring: Ring,
) {
    std::fs::write(dir.join("f"), b"data").unwrap();
    let mut vmm = connect(ring.opts(VmmOptions::default()));
    version(&mut vmm, 65536);

    // Chains the walker refuses, from virtqueue-large's malicious
    // patterns of each layout: a buffer outside guest memory, a loop or a
    // chain ending in a slot never made available, a readable descriptor
    // after a writable one, an indirect table with a bad length, and a
    // table inside a table.
    let heads: Vec<Option<u16>> = match ring {
        Ring::Split => {
            let d = vmm.split_driver().unwrap();
            [
                Malicious::BufferPastEnd,
                Malicious::RingLoop,
                Malicious::ReadableAfterWritable,
                Malicious::IndirectTableMisaligned,
                Malicious::NestedIndirect,
            ]
            .into_iter()
            .map(|p| d.add_malicious(p).unwrap())
            .collect()
        }
        Ring::Packed => {
            let d = vmm.packed_driver().unwrap();
            [
                PackedMalicious::BufferPastEnd,
                PackedMalicious::ReadableAfterWritable,
                PackedMalicious::IndirectTableMisaligned,
                PackedMalicious::NestedIndirect,
                PackedMalicious::TableOutsideMemory,
            ]
            .into_iter()
            .map(|p| d.add_malicious(p).unwrap())
            .collect()
        }
    };
    assert!(heads.iter().all(Option::is_some), "{heads:?}");
    vmm.kick().unwrap();
    let mut used = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while used.len() < heads.len() && Instant::now() < deadline {
        used.extend(vmm.wait_used(Duration::from_millis(200)).unwrap());
    }
    let mut got: Vec<u32> = used.iter().map(|u| u.id).collect();
    let mut want: Vec<u32> = heads.iter().flatten().copied().map(u32::from).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "refused chains come back: {used:?}");
    assert!(used.iter().all(|u| u.len == 0), "{used:?}");

    // 5. Malformed 9P: garbage, a size larger than the buffer, a truncated
    // header, no room for a reply. Each is answered or returned, and the
    // queue goes on.
    let garbage = vmm.call(&[0xff; 32], 64, Layout::Direct).unwrap();
    assert_eq!(garbage[4], MsgType::Rlerror, "{garbage:?}");
    let mut lying = frame(7, Tmessage::Clunk(Tfid { fid: 1 }));
    lying[0..4].copy_from_slice(&1000u32.to_le_bytes());
    assert_eq!(
        vmm.call(&lying, 64, Layout::Direct).unwrap()[4],
        MsgType::Rlerror
    );
    assert!(vmm.call(&[1, 2, 3], 64, Layout::Direct).unwrap().is_empty());
    assert!(vmm
        .call(
            &frame(8, Tmessage::Clunk(Tfid { fid: 1 })),
            4,
            Layout::Direct
        )
        .unwrap()
        .is_empty());

    // Still serving.
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    assert_eq!(read_fid1(&mut vmm), b"data");
}

/// The ring is stopped (GET_VRING_BASE, as a VMM does before a device
/// reset) with 60 Tlocks blocked in flight on a 64-entry ring: the device
/// keeps them in flight (a pause no lock waiter notices), writes nothing,
/// and the base is the driver's position, the waiters counted as taken
/// (for packed, past the end of the ring: the wrap counter flipped). Then
/// it is started again from scratch: the kept waiters belong to another
/// ring and are discarded, a start at a base past the ring is refused,
/// nothing of the old ring comes back, and the new ring serves.
pub fn reset_with_requests_in_flight(
    dir: &Path,
    connect: impl FnOnce(VmmOptions) -> FakeVmm,
    ring: Ring,
) {
    let path = dir.join("lockme");
    std::fs::write(&path, b"x").unwrap();
    std::fs::write(dir.join("f"), b"after reset").unwrap();
    let holder = hold_lock(&path);
    let mut vmm = connect(ring.opts({
        let mut o = VmmOptions::default();
        o.mem_size = 16 << 20;
        o.queue_size = 64;
        o
    }));
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    let mut subs = Vec::new();
    for tag in 100..160u16 {
        let lock = Tmessage::Lock(Tlock {
            fid: 1,
            ty: LockType::Wrlck,
            flags: LockFlags::BLOCK,
            start: 0,
            length: 0,
            proc_id: u32::from(tag),
            client_id: b"guest".to_vec(),
        });
        subs.push(
            vmm.submit(&frame(tag, lock), 64, Layout::Indirect { seg: 64 })
                .unwrap(),
        );
    }
    vmm.kick().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(vmm.collect_used().unwrap().is_empty());

    let expected = vmm.driver_ring_base();
    if ring == Ring::Packed {
        // 4 direct setup chains (8 slots) and 60 one-slot chains: slot 4
        // of the second lap, wrap counter 0.
        assert_eq!(expected, 4);
    } else {
        assert_eq!(expected, 64);
    }
    assert_eq!(vmm.stop_ring().unwrap(), expected);
    // Paused: the waiters stay in flight, nothing is written.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a waiter was answered at the stop"
    );

    // A frontend that starts the ring at a base past its end (slot 4096
    // of 64; for split, an available index 4096 ahead of the ring's): the
    // device refuses the ring and serves nothing from it, without
    // breaking the connection.
    vmm.restart_ring_at(Some(0x8000 | 4096)).unwrap();
    vmm.submit(
        &frame(200, Tmessage::Clunk(Tfid { fid: 1 })),
        64,
        Layout::Direct,
    )
    .unwrap();
    vmm.kick().unwrap();
    assert!(vmm
        .wait_used(Duration::from_millis(300))
        .unwrap()
        .is_empty());
    vmm.stop_ring().unwrap();

    vmm.restart_ring().unwrap();
    ofd_lock(&holder, libc::F_UNLCK);

    // A new session on the new ring.
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    assert_eq!(read_fid1(&mut vmm), b"after reset");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a stopped request came back on the new ring"
    );
}

/// A blocking write Tlock of the whole file on fid 1, tagged `tag` (its
/// `proc_id` too).
pub fn blocking_lock(tag: u16) -> Vec<u8> {
    frame(
        tag,
        Tmessage::Lock(Tlock {
            fid: 1,
            ty: LockType::Wrlck,
            flags: LockFlags::BLOCK,
            start: 0,
            length: 0,
            proc_id: u32::from(tag),
            client_id: b"guest".to_vec(),
        }),
    )
}
