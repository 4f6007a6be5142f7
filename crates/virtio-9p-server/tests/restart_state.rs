// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A session saved by one server and restored by a new one over the same
//! export, as a restarted daemon does: fids, open files, locks, xattr
//! buffers and the msize come back; state that is damaged, cut short,
//! from another version or for another export is refused with a clear
//! message.

mod common;

use std::os::fd::AsRawFd;
use std::sync::Arc;

use common::{server_with, MSIZE, ROOT};
use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::error::StateProblem;
use virtio_9p_server::protocol::*;
use virtio_9p_server::{Config, Error, PassthroughConfig, PassthroughFs, Server};

type TestClient = Client<InProcess<PassthroughFs>>;

fn server(dir: &std::path::Path) -> Arc<Server<PassthroughFs>> {
    server_with(PassthroughConfig::new(dir), Config::default())
}

fn client(server: Arc<Server<PassthroughFs>>) -> TestClient {
    let mut c = Client::new(InProcess::new(server, MSIZE as usize));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

/// Whether an OFD write lock on the whole of `path` is free for this
/// process (a lock held by the server's open file conflicts).
fn lock_is_free(path: &std::path::Path) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: a valid fd and flock pointer for the call.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
}

/// A session with a walked directory, a file open for writing with a
/// lock, a file created through Tlcreate, and a half-written xattr; the
/// client and its saved state.
fn busy_session(dir: &std::path::Path) -> (TestClient, Vec<u8>) {
    std::fs::create_dir(dir.join("d")).unwrap();
    std::fs::write(dir.join("d/f"), b"before").unwrap();
    let server = server(dir);
    let mut c = client(Arc::clone(&server));
    c.walk(ROOT, 1, &[b"d"]).unwrap();
    c.walk(1, 2, &[b"f"]).unwrap();
    c.lopen(2, OpenFlags::RDWR | OpenFlags::TRUNC).unwrap();
    c.write(2, 0, b"written before the restart").unwrap();
    assert_eq!(
        c.lock(2, LockType::Wrlck, LockFlags::empty(), 0, 0)
            .unwrap(),
        LockStatus::Success
    );
    c.walk(1, 3, &[]).unwrap();
    c.lcreate(3, b"new", OpenFlags::RDWR | OpenFlags::EXCL, 0o644, 0)
        .unwrap();
    c.write(3, 0, b"created").unwrap();
    c.walk(1, 4, &[b"f"]).unwrap();
    c.xattrcreate(4, b"user.half", 8, 0).unwrap();
    c.write(4, 0, b"half").unwrap();
    let saved = server.save_session(c.transport().session()).unwrap();
    (c, saved)
}

#[test]
fn test_a_new_server_takes_the_session_over() {
    let dir = tempfile::tempdir().unwrap();
    let (old, saved) = busy_session(dir.path());
    // The old daemon dies: its fds close and its locks go.
    drop(old);
    assert!(lock_is_free(&dir.path().join("d/f")));

    let server = server(dir.path());
    let session = server.restore_session(&saved).unwrap();
    assert_eq!(session.msize(), MSIZE);
    assert_eq!(session.fid_count(), 5);
    let mut c = Client::new(InProcess::with_session(server, session, MSIZE as usize));
    // No Tversion, no Tattach: the guest just goes on.
    assert_eq!(c.read(2, 0, 64).unwrap(), b"written before the restart");
    // The open file was not truncated again, and it is still writable.
    c.write(2, 0, b"W").unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("d/f")).unwrap(),
        b"Written before the restart"
    );
    // The lock is held again.
    assert!(!lock_is_free(&dir.path().join("d/f")));
    // The created file is open, not created again (EXCL would fail).
    assert_eq!(c.read(3, 0, 64).unwrap(), b"created");
    // The walked directory still walks.
    c.walk(1, 9, &[b"new"]).unwrap();
    // The half-written xattr completes on clunk.
    c.write(4, 4, b"done").unwrap();
    c.clunk(4).unwrap();
    c.walk(1, 11, &[b"f"]).unwrap();
    assert_eq!(c.get_xattr(11, 12, b"user.half").unwrap(), b"halfdone");
}

#[test]
fn test_a_file_renamed_on_the_host_is_found_by_its_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (old, saved) = busy_session(dir.path());
    drop(old);
    std::fs::rename(dir.path().join("d/f"), dir.path().join("moved")).unwrap();
    let server = server(dir.path());
    let session = server.restore_session(&saved).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // open_by_handle_at (CAP_DAC_READ_SEARCH): the open fid follows
        // the file; the walked-only fid 4 too.
        assert_eq!(session.fid_count(), 5);
        let mut c = Client::new(InProcess::with_session(server, session, MSIZE as usize));
        assert_eq!(c.read(2, 0, 64).unwrap(), b"written before the restart");
    } else {
        // Without the capability the renamed file's fids are left out;
        // the rest come back.
        assert_eq!(session.fid_count(), 3);
    }
}

#[test]
fn test_state_for_another_export_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_old, saved) = busy_session(dir.path());
    let other = tempfile::tempdir().unwrap();
    let e = server(other.path()).restore_session(&saved).unwrap_err();
    assert!(matches!(e, Error::State(StateProblem::Foreign)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "saved session state refused: saved for another export"
    );
}

#[test]
fn test_damaged_truncated_and_other_version_states_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_old, saved) = busy_session(dir.path());
    let server = server(dir.path());
    let cut = &saved[..saved.len() / 2];
    let e = server.restore_session(cut).unwrap_err();
    assert!(
        matches!(e, Error::State(StateProblem::Truncated { .. })),
        "{e:?}"
    );
    let mut flipped = saved.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let e = server.restore_session(&flipped).unwrap_err();
    assert_eq!(
        e.to_string(),
        "saved session state refused: checksum mismatch (damaged)"
    );
    let mut newer = saved.clone();
    newer[8] = 9;
    let e = server.restore_session(&newer).unwrap_err();
    assert_eq!(
        e.to_string(),
        "saved session state refused: format version 9, this build reads version 2"
    );
    let e = server.restore_session(b"{\"fids\": []}").unwrap_err();
    assert_eq!(
        e.to_string(),
        "saved session state refused: not a virtio-9p-server state file"
    );
}
