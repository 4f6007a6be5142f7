//! Command-line options of the `virtio-9p-server` binary.

use std::path::PathBuf;

use clap::Parser;

use virtio_9p_server::protocol::MAX_MSIZE;
use virtio_9p_server::sandbox::seccomp::SeccompMode;
use virtio_9p_server::sandbox::{IdMap, IdSquash, SandboxMode};
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

    /// Allow a writable export with --security-model passthrough or none
    /// on --listen tcp:HOST:PORT, which is refused otherwise: TCP has no
    /// authentication, so anyone who can connect acts as the guest, with
    /// the daemon's power over the host files.
    #[arg(long)]
    pub allow_unauthenticated_tcp_passthrough: bool,

    /// Group that may connect to the unix socket (--socket-path or
    /// --listen unix:), by name or number: the socket becomes mode 0660
    /// and owned by that group. Default: owner only (0600).
    #[arg(long, value_name = "GROUP", conflicts_with = "fd")]
    pub socket_group: Option<String>,

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

    /// Hardening options (see SECURITY.md).
    #[command(flatten)]
    pub hardening: Hardening,
}

/// The sandbox options (issue 12).
#[derive(Debug, Clone, clap::Args)]
pub struct Hardening {
    /// Confinement: namespace (new mount, pid and net namespaces and
    /// pivot_root into the shared dir), chroot, or none.
    #[arg(long, value_name = "MODE", default_value = "namespace")]
    pub sandbox: SandboxMode,

    /// Action on a syscall outside the allow-list: kill, log, trap or none.
    #[arg(long, value_name = "ACTION", default_value = "kill")]
    pub seccomp: SeccompMode,

    /// Adjust the capabilities kept: `+name` / `-name`, comma separated
    /// (for example `+sys_admin,-mknod`).
    #[arg(long, value_name = "CAPS")]
    pub modcaps: Option<String>,

    /// RLIMIT_NOFILE (soft and hard) for the daemon; the fid limit is set
    /// from it. Default: raise the soft limit to the hard one.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(64..))]
    pub rlimit_nofile: Option<u64>,

    /// User-namespace uid map `inside:outside:count` (unprivileged
    /// namespace sandbox; repeatable). Default: the current uid to itself.
    #[arg(long, value_name = "MAP")]
    pub uid_map: Vec<IdMap>,

    /// User-namespace gid map `inside:outside:count` (repeatable).
    #[arg(long, value_name = "MAP")]
    pub gid_map: Vec<IdMap>,

    /// uid squashing: `squash-guest:HOSTUID` (every uid the guest sets
    /// becomes HOSTUID) or `squash-host:GUESTUID` (every file reads as
    /// owned by GUESTUID).
    #[arg(long, value_name = "RULE")]
    pub translate_uid: Option<IdSquash>,

    /// gid squashing, as --translate-uid.
    #[arg(long, value_name = "RULE")]
    pub translate_gid: Option<IdSquash>,

    /// Test-only hooks run right after the sandbox is set up
    /// (`forbidden-syscall`, `probe:PATH`); never use them in production.
    #[arg(long, value_name = "HOOK", hide = true)]
    pub test_hook: Vec<String>,
}
