// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The library's defaults are bounded for a server embedded in a VMM's
//! process: a guest that opens files without end gets errors, and the
//! embedding process keeps its fds. One test in its own binary, so that
//! the fd counts are this test's alone.

use std::sync::Arc;

use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::engine::{EngineConfig, DEFAULT_WORKERS};
use virtio_9p_server::protocol::OpenFlags;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server, DEFAULT_MAX_FIDS};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn test_guest_cannot_exhaust_the_embedders_fds() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..600 {
        std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
    }
    // The documented defaults.
    assert_eq!(Config::default().max_open_fids, 256);
    assert_eq!(PassthroughConfig::new(dir.path()).max_path_fds, 256);
    assert_eq!(EngineConfig::default().workers, 2);
    assert_eq!(EngineConfig::sized_to_process().workers, DEFAULT_WORKERS);
    let sized = Config::sized_to_process().max_open_fids;
    assert!((256..=DEFAULT_MAX_FIDS).contains(&sized), "{sized}");

    let before = open_fds();
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let mut guest = Client::new(InProcess::new(server, 1 << 16));
    guest.version(1 << 16).unwrap();
    guest.attach(0, 0).unwrap();
    // Walk to 600 files (more than the path fd cache) and open each one:
    // the opens past the limit fail with EMFILE, the walks do not.
    let mut opened = 0;
    let mut refused = 0;
    for i in 0..600u32 {
        let name = format!("f{i}");
        guest.walk(0, i + 1, &[name.as_bytes()]).unwrap();
        match guest.lopen(i + 1, OpenFlags::RDONLY) {
            Ok(_) => opened += 1,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(opened, 256);
    assert_eq!(refused, 600 - 256);
    // The server holds at most its open fids, its path fds and a few of
    // its own; the embedder still opens files.
    let held = open_fds() - before;
    assert!(held <= 256 + 256 + 16, "the server holds {held} fds");
    let mine = std::fs::File::open(dir.path().join("f0"));
    assert!(mine.is_ok(), "the embedder cannot open a file: {mine:?}");
}
