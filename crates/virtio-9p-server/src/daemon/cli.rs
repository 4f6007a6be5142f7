// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Command-line options of the `virtio-9p-server` binary.

use std::io;
use std::path::PathBuf;

use clap::Parser;

use super::error::{Error, Result};
use super::sandbox::seccomp::SeccompMode;
use super::sandbox::SandboxMode;
use virtio_9p_server::fs::ids::{IdMap, IdRule};
use virtio_9p_server::protocol::MAX_MSIZE;
use virtio_9p_server::transport::socket::ListenAddr;
use virtio_9p_server::{MigrationMode, SecurityModel};

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

    /// Run every filesystem call on a worker thread, also the short
    /// metadata calls (Tgetattr, Twalk, Tclunk, ...) that otherwise run on
    /// the device or connection thread when the shared dir is on a local
    /// filesystem (ext4, xfs, btrfs, tmpfs, overlayfs, ...). Use it when a
    /// network or FUSE filesystem is mounted below the shared dir.
    #[arg(long)]
    pub no_inline_metadata: bool,

    /// How guest ownership maps to the host: passthrough, mapped-xattr
    /// (QEMU-compatible user.virtfs.* xattrs) or none.
    #[arg(long, value_name = "MODEL", default_value = "passthrough")]
    pub security_model: SecurityModel,

    /// The export's name for live migration: a saved device state names
    /// the export by it, so a daemon on another host exporting the same
    /// tree (at any path) under the same name takes it. Without it the
    /// export is named by its root's (dev, ino): only this directory on
    /// this host matches. 1 to 255 bytes, no NUL.
    #[arg(long, value_name = "NAME", value_parser = parse_export_name)]
    pub export_name: Option<String>,

    /// How a migrated (or restarted) session finds its files again:
    /// file-handles (the same file by device and inode, by path or file
    /// handle: both daemons see one filesystem) or find-paths (the file at
    /// the same path below the export, of the same type: another host
    /// holding the same tree; a file gone or changed answers ESTALE).
    #[arg(long, value_name = "MODE", default_value = "file-handles")]
    pub migration_mode: MigrationMode,

    /// Largest msize granted to clients, in bytes (4096..=134217728).
    #[arg(long, value_name = "BYTES", default_value_t = MAX_MSIZE,
          value_parser = clap::value_parser!(u32).range(4096..=134_217_728))]
    pub msize_max: u32,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    pub log_level: log::LevelFilter,

    /// Log to syslog (/dev/log, facility daemon) instead of stderr.
    #[arg(long)]
    pub syslog: bool,

    /// vhost-user daemon options (used when --listen is not given).
    #[command(flatten)]
    pub vhost: super::vhost_mode::VhostUserArgs,

    /// Hardening options (see SECURITY.md).
    #[command(flatten)]
    pub hardening: Hardening,
}

/// The sandbox options.
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

    /// RLIMIT_NOFILE (soft and hard) for the daemon, 0 or at least 64;
    /// the fid limit is set from it. 0 leaves the limit as inherited.
    /// Default: raise the soft limit to the hard one.
    #[arg(long, value_name = "N", value_parser = parse_nofile)]
    pub rlimit_nofile: Option<u64>,

    /// User-namespace uid map `:inside:outside:count:` (virtiofsd's
    /// syntax; `inside:outside:count` also works) for the unprivileged
    /// namespace sandbox; repeatable. Default: the current uid to itself.
    #[arg(long, value_name = "MAP")]
    pub uid_map: Vec<IdMap>,

    /// User-namespace gid map `:inside:outside:count:` (repeatable).
    #[arg(long, value_name = "MAP")]
    pub gid_map: Vec<IdMap>,

    /// uid translation, virtiofsd's grammar (repeatable):
    /// `guest:GUEST:HOST:COUNT`, `host:HOST:GUEST:COUNT`,
    /// `squash-guest:GUEST:HOST:COUNT`, `squash-host:HOST:GUEST:COUNT`,
    /// `forbid-guest:GUEST:COUNT` or `map:GUEST:HOST:COUNT`.
    /// `squash-guest:HOST` and `squash-host:GUEST` squash every id.
    #[arg(long, value_name = "RULE")]
    pub translate_uid: Vec<IdRule>,

    /// gid translation, as --translate-uid (repeatable).
    #[arg(long, value_name = "RULE")]
    pub translate_gid: Vec<IdRule>,

    /// Hooks for the integration tests, run right after the sandbox is set
    /// up (`forbidden-syscall`, `probe:PATH`, `budget`). Hidden, and in
    /// every build: the binary is built without cfg(test), and a feature
    /// for it would be public (docs.rs turns every feature on). Each hook
    /// is harmless in the hands of whoever writes the command line, who
    /// already controls the daemon: it reports what the confined process
    /// sees of a path or its mapping budget, waits for a byte on stdin,
    /// or makes one syscall the filter forbids (which kills the daemon).
    /// None widens the sandbox or reaches a guest.
    #[arg(long, value_name = "HOOK", hide = true)]
    pub test_hook: Vec<String>,
}

/// `--rlimit-nofile`: 0 (leave it alone, as virtiofsd) or at least 64.
fn parse_nofile(s: &str) -> Result<u64> {
    match s.parse::<u64>() {
        Ok(n) if n == 0 || n >= 64 => Ok(n),
        _ => Err(Error::RlimitNofile(s.to_owned())),
    }
}

/// The gid of a group given by name or number (`--socket-group`).
pub fn group_id(name: &str) -> io::Result<libc::gid_t> {
    if let Ok(n) = name.parse::<libc::gid_t>() {
        return Ok(n);
    }
    let c = std::ffi::CString::new(name)?;
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: zeroed group and null result pointer are valid out values.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: valid C string, out pointers and a buffer of buf.len() bytes.
        let r = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast::<libc::c_char>(),
                buf.len(),
                &mut result,
            )
        };
        if r == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if result.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no group named {name:?}"),
            ));
        }
        return Ok(grp.gr_gid);
    }
}

/// The options of the vhost-user daemon, which do nothing in socket mode
/// (`--listen`): every option of [`VhostUserArgs`] (clap id and flag) but
/// `--print-capabilities`, which runs before anything else, and
/// `--thread-pool-size`, which sizes the socket mode's worker pool too. An
/// option added there is refused in socket mode without a change here.
///
/// [`VhostUserArgs`]: super::vhost_mode::VhostUserArgs
pub fn vhost_user_only() -> Vec<(String, String)> {
    use clap::Args;
    super::vhost_mode::VhostUserArgs::augment_args(clap::Command::new("vhost-user"))
        .get_arguments()
        .filter(|a| a.get_id() != "print_capabilities" && a.get_id() != "thread_pool_size")
        .filter_map(|a| Some((a.get_id().to_string(), format!("--{}", a.get_long()?))))
        .collect()
}

/// Options of socket mode that do nothing in the vhost-user daemon.
pub const SOCKET_ONLY: &[(&str, &str)] = &[(
    "allow_unauthenticated_tcp_passthrough",
    "--allow-unauthenticated-tcp-passthrough",
)];

/// Refuses an option given on the command line that the chosen mode
/// would ignore, so that nobody believes, say, memory is locked when it is
/// not.
pub fn check_mode(cli: &Cli, matches: &clap::ArgMatches) -> Result<()> {
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(clap::parser::ValueSource::CommandLine)
        )
    };
    let (wrong, mode): (Vec<(String, String)>, _) = match cli.listen {
        Some(_) => (vhost_user_only(), "socket mode (--listen)"),
        None => (
            SOCKET_ONLY
                .iter()
                .map(|(id, flag)| (id.to_string(), flag.to_string()))
                .collect(),
            "the vhost-user daemon (no --listen)",
        ),
    };
    match wrong.iter().find(|(id, _)| given(id)) {
        Some((_, flag)) => Err(Error::WrongMode {
            flag: flag.clone(),
            mode,
        }),
        None => Ok(()),
    }
}

/// Parses the command line (clap prints its own errors and exits).
pub fn parse() -> (Cli, clap::ArgMatches) {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => (cli, matches),
        Err(e) => e.exit(),
    }
}

/// `--export-name`: 1 to 255 bytes, no NUL.
fn parse_export_name(s: &str) -> std::result::Result<String, String> {
    if s.is_empty() || s.len() > 255 || s.contains('\0') {
        return Err("an export name is 1 to 255 bytes, without NUL".into());
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// `check_mode` on a command line that clap accepts.
    fn check(args: &[&str]) -> Result<()> {
        let m = Cli::command()
            .try_get_matches_from(std::iter::once("virtio-9p-server").chain(args.iter().copied()))
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        check_mode(&cli, &m)
    }

    #[test]
    fn test_export_name_and_migration_mode() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(
                ["virtio-9p-server", "--shared-dir", "/d"]
                    .iter()
                    .chain(args.iter())
                    .copied(),
            )
        };
        let cli = parse(&["--export-name", "vol1", "--migration-mode", "find-paths"]).unwrap();
        assert_eq!(cli.export_name.as_deref(), Some("vol1"));
        assert_eq!(cli.migration_mode, MigrationMode::FindPaths);
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.export_name, None);
        assert_eq!(cli.migration_mode, MigrationMode::FileHandles);
        let long = "x".repeat(256);
        for bad in [
            &["--export-name", ""][..],
            &["--export-name", long.as_str()],
            &["--migration-mode", "by-inode"],
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(!e.contains("panicked"), "{e}");
        }
    }

    #[test]
    fn test_options_of_the_other_mode_are_refused() {
        let sock = ["--shared-dir", "/d", "--listen", "unix:/s"];
        for (opt, value) in [
            ("--tag", Some("t")),
            ("--queue-size", Some("256")),
            ("--mlock", Some("on")),
            ("--socket-path", Some("/v")),
            ("--fd", Some("3")),
            ("--keep-serving", None),
            ("--no-packed-ring", None),
        ] {
            let mut args = sock.to_vec();
            args.push(opt);
            args.extend(value);
            let e = check(&args).unwrap_err().to_string();
            assert_eq!(e, format!("{opt} does not apply to socket mode (--listen)"));
        }
        let e = check(&[
            "--shared-dir",
            "/d",
            "--allow-unauthenticated-tcp-passthrough",
        ])
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "--allow-unauthenticated-tcp-passthrough does not apply to the vhost-user daemon (no --listen)"
        );
    }

    #[test]
    fn test_every_vhost_user_option_is_listed() {
        let flags: Vec<String> = vhost_user_only().into_iter().map(|(_, f)| f).collect();
        for f in [
            "--socket-path",
            "--fd",
            "--tag",
            "--queue-size",
            "--mlock",
            "--keep-serving",
            "--no-packed-ring",
        ] {
            assert!(flags.iter().any(|x| x == f), "{f} missing from {flags:?}");
        }
        assert!(!flags.iter().any(|x| x == "--print-capabilities"));
        // It sizes the socket mode's worker pool too.
        assert!(!flags.iter().any(|x| x == "--thread-pool-size"));
        // Each listed id is a real argument (clap panics on unknown ids).
        let m = Cli::command()
            .try_get_matches_from(["x", "--shared-dir", "/d"])
            .unwrap();
        for (id, _) in vhost_user_only() {
            assert_eq!(m.value_source(&id).is_some(), m.contains_id(&id));
        }
    }

    #[test]
    fn test_options_of_both_modes_are_accepted() {
        let common = [
            "--readonly",
            "--syslog",
            "--msize-max",
            "65536",
            "--rlimit-nofile",
            "0",
            "--uid-map",
            ":0:1000:1:",
            "--translate-uid",
            "map:0:1000:1",
            "--translate-uid",
            "forbid-guest:1:10",
        ];
        let mut a = vec![
            "--shared-dir",
            "/d",
            "--listen",
            "unix:/s",
            "--thread-pool-size",
            "2",
        ];
        a.extend(common);
        check(&a).unwrap();
        let mut a = vec![
            "--shared-dir",
            "/d",
            "--tag",
            "t",
            "--thread-pool-size",
            "0",
            "--keep-serving",
        ];
        a.extend(common);
        check(&a).unwrap();
        check(&[
            "--shared-dir",
            "/d",
            "--listen",
            "tcp:127.0.0.1:1",
            "--allow-unauthenticated-tcp-passthrough",
        ])
        .unwrap();
    }

    #[test]
    fn test_bad_values_name_what_is_wrong() {
        // The typed errors of the value parsers reach the user through
        // clap's one-line "invalid value" error, with the same wording as
        // before they were typed.
        for (args, want) in [
            (
                ["--sandbox", "jail"],
                "unknown sandbox mode \"jail\" (namespace, chroot or none)",
            ),
            (
                ["--seccomp", "maybe"],
                "unknown seccomp mode \"maybe\" (kill, log, trap or none)",
            ),
            (
                ["--rlimit-nofile", "12"],
                "expected 0 (leave the limit alone) or a number of at least 64",
            ),
            (
                ["--thread-pool-size", "x"],
                "expected 0 (requests run on the vring thread) or a number up to",
            ),
        ] {
            let e = Cli::command()
                .try_get_matches_from(["x", "--shared-dir", "/d", args[0], args[1]])
                .unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
            assert!(e.to_string().contains(want), "{args:?}: {e}");
        }
        // A pid file holder without a pid: no empty parentheses.
        let e = Error::AlreadyRunning {
            socket: "/run/s".into(),
            pid_file: "/run/s.pid".into(),
            holder: None,
        };
        assert_eq!(
            e.to_string(),
            "another instance is already serving /run/s: its pid file /run/s.pid is locked"
        );
    }

    #[test]
    fn test_rlimit_nofile_values() {
        for ok in ["0", "64", "1048576"] {
            assert!(parse_nofile(ok).is_ok(), "{ok}");
        }
        for bad in ["1", "63", "-1", "x", ""] {
            assert!(
                parse_nofile(bad)
                    .unwrap_err()
                    .to_string()
                    .starts_with("expected 0"),
                "{bad}"
            );
        }
    }

    #[test]
    fn test_group_id_by_name_or_number() {
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        let e = group_id("no-such-group-9p").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
