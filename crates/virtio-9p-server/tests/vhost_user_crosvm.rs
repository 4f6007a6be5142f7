//! vhost-user integration: the daemon as crosvm's generic vhost-user
//! frontend (`--vhost-user type=9p,...`) drives it. That frontend offers
//! the guest no indirect descriptors, learns the queue count with
//! `GET_QUEUE_NUM`, reads the config space with the `WRITABLE` flag set,
//! and offers 32768-entry queues unless told `max-queue-size`; a Linux
//! guest then sends each Tread's pages as a direct chain in the ring.

mod vhost_user_support;

use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vhost_user_support::scenarios::attach_open;
use vhost_user_support::*;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{Layout, VmmOptions};

#[test]
fn test_crosvm_style_frontend_reads_through_direct_chains() {
    let d = TestDaemon::start(2);
    let msize = 512_000u32;
    let data: Vec<u8> = (0..3 * msize).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.dir.path().join("f"), &data).unwrap();
    let mut vmm = d.connect(VmmOptions {
        indirect: false,
        ..VmmOptions::default()
    });
    assert_eq!(vmm.features() & (1 << 28), 0, "indirect descriptors acked");
    assert_eq!(vmm.frontend().get_queue_num().unwrap(), 1);
    let (_, tag) = vmm
        .frontend()
        .get_config(0, 7, VhostUserConfigFlags::WRITABLE, &[0u8; 7])
        .unwrap();
    assert_eq!(tag, b"\x05\x00share");

    assert_eq!(version(&mut vmm, msize), msize);
    attach_open(&mut vmm, "f", 0);
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
        assert_eq!(reply[4], TREAD + 1);
        assert_eq!(&reply[7..11], &count.to_le_bytes());
        let at = offset as usize;
        assert!(
            reply[11..] == data[at..at + count as usize],
            "data read at {offset} differs from the file"
        );
    }
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
