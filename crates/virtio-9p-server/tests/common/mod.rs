//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use virtio_9p_server::client::{Client, InProcess};
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
