//! Command-line options of the `virtio-9p-server` binary.

use std::path::PathBuf;

use clap::Parser;

use virtio_9p_server::protocol::MAX_MSIZE;
use virtio_9p_server::transport::socket::ListenAddr;
use virtio_9p_server::SecurityModel;

/// A 9P2000.L file server for virtual machines.
///
/// Socket mode: `virtio-9p-server --listen unix:/run/9p.sock --shared-dir DIR`,
/// then in a Linux guest or host:
/// `mount -t 9p -o trans=unix,version=9p2000.L,access=client,uname=root /run/9p.sock /mnt`.
#[derive(Debug, Parser)]
#[command(name = "virtio-9p-server", version, arg_required_else_help = true)]
pub struct Cli {
    /// Directory to export.
    #[arg(long, value_name = "DIR")]
    pub shared_dir: PathBuf,

    /// Serve 9P on a socket: `unix:PATH` or `tcp:HOST:PORT` (loopback
    /// recommended: 9P has no authentication).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<ListenAddr>,

    /// Export read-only: every change fails with EROFS.
    #[arg(long)]
    pub readonly: bool,

    /// How guest ownership maps to the host: passthrough, mapped-xattr
    /// (QEMU-compatible user.virtfs.* xattrs) or none.
    #[arg(long, value_name = "MODEL", default_value = "passthrough")]
    pub security_model: SecurityModel,

    /// Largest msize granted to clients, in bytes (4096..=134217728).
    #[arg(long, value_name = "BYTES", default_value_t = MAX_MSIZE,
          value_parser = clap::value_parser!(u32).range(4096..=134_217_728))]
    pub msize_max: u32,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    pub log_level: log::LevelFilter,

    /// vhost-user daemon options (used when --listen is not given).
    #[command(flatten)]
    pub vhost: virtio_9p_server::vhost_user::VhostUserArgs,
}
