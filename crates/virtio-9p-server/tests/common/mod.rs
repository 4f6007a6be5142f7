//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::protocol::Tsetattr;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, SecurityModel, Server};

pub const ROOT: u32 = 0;
pub const MSIZE: u32 = 256 << 10;

pub type TestClient = Client<InProcess<PassthroughFs>>;

pub fn server_with(cfg: PassthroughConfig, config: Config) -> Arc<Server<PassthroughFs>> {
    Arc::new(Server::new(PassthroughFs::new(cfg).unwrap(), config).unwrap())
}

/// A client attached (fid ROOT, uid 0) to a passthrough export of `dir`.
pub fn client_for(
    dir: &std::path::Path,
    model: SecurityModel,
    readonly: bool,
    openat2: bool,
) -> TestClient {
    let mut cfg = PassthroughConfig::new(dir);
    cfg.security_model = model;
    cfg.readonly = readonly;
    cfg.use_openat2 = openat2;
    let server = server_with(cfg, Config::default());
    let mut c = Client::new(InProcess::new(server, MSIZE as usize));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

pub fn client(dir: &std::path::Path) -> TestClient {
    client_for(dir, SecurityModel::Passthrough, false, true)
}

pub fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// A Tsetattr for `fid` that changes nothing (`valid` 0, every field 0),
/// to fill the rest of a struct update.
pub fn setattr_base(fid: u32) -> Tsetattr {
    Tsetattr {
        fid,
        valid: 0,
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime_sec: 0,
        atime_nsec: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
    }
}
