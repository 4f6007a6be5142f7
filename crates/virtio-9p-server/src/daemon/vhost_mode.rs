// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vhost-user options of the `virtio-9p-server` binary and the code
//! that runs the library's [`Daemon`] from them.

use std::path::PathBuf;
use std::sync::Arc;

use log::{info, warn};
use mlock_policy::MlockPolicy;

use super::error::{Error, Result};
use super::sandbox::seccomp::{self, ThreadKind};
use virtio_9p_server::engine::{OffloadPolicy, DEFAULT_WORKERS, MAX_WORKERS};
use virtio_9p_server::fs::Filesystem;
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen, DEFAULT_SOCKET_PATH};
use virtio_9p_server::virtio::{DEFAULT_QUEUE_SIZE, MAX_QUEUE_SIZE};
use virtio_9p_server::Server;

use super::keeper::FdStore;
use super::signals;
use super::state_dir::StateDir;

/// What `--print-capabilities` prints: a `VHostUserBackendCapabilities`
/// of QEMU's `docs/interop/vhost-user.json`. `9p` is a member of its
/// `VHostUserBackendType` enum, and the schema defines no features for
/// it, so the object holds the type alone. It matches the `type` of the
/// descriptor shipped as `50-virtio-9p-server.json`.
pub const CAPABILITIES_JSON: &str = "{\n  \"type\": \"9p\"\n}";

/// Options of the vhost-user daemon (used when `--listen` is not given).
#[derive(Debug, Clone, clap::Args)]
pub struct VhostUserArgs {
    /// vhost-user socket to create, mode 0600 (a stale socket there is
    /// replaced; a file, a directory or a live socket is refused).
    /// Default when neither this nor --fd is given: ./virtio-9p.sock.
    #[arg(long, value_name = "PATH", conflicts_with = "fd")]
    pub socket_path: Option<PathBuf>,

    /// An inherited, listening vhost-user unix socket.
    #[arg(long, value_name = "N")]
    pub fd: Option<i32>,

    /// Mount tag the guest sees (1 to 254 bytes).
    #[arg(long, value_name = "TAG", default_value = "share")]
    pub tag: String,

    /// Largest virtqueue size, which is the in-flight request limit (a
    /// power of two up to 32768).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_QUEUE_SIZE,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_QUEUE_SIZE)))]
    pub queue_size: u16,

    /// Worker threads that run blocking filesystem calls while request
    /// coroutines wait. 0, as in virtiofsd, runs every request on the
    /// vring thread (in socket mode: on the socket threads, whose workers
    /// every connection shares).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WORKERS,
          value_parser = parse_workers)]
    pub thread_pool_size: usize,

    /// Do not offer packed virtqueues (VIRTIO_F_RING_PACKED): every driver
    /// then uses the split ring. Default: offered, the driver chooses.
    #[arg(long)]
    pub no_packed_ring: bool,

    /// Serve the next frontend after one disconnects. Default: exit when
    /// the frontend disconnects, as virtiofsd does.
    #[arg(long)]
    pub keep_serving: bool,

    /// Lock the daemon's memory: off, on or on-fault (mlockall before
    /// serving; on-fault locks pages as they are touched).
    #[arg(long, value_name = "POLICY", default_value = "off")]
    pub mlock: MlockPolicy,

    /// How often, in milliseconds, the coroutine stack pool frees idle
    /// stacks above the recent high-water mark of requests (0: never).
    #[arg(long, value_name = "MS", default_value_t = coro_pool::DEFAULT_TRIM_INTERVAL.as_millis() as u64)]
    pub stack_trim_interval_ms: u64,

    /// Where the session is kept crash-safe (a snapshot and a journal of
    /// fid changes), and where a handover (SIGUSR1: finish the requests
    /// in flight, save the session, exit) leaves it: a new daemon started
    /// with the same option takes it over, after an upgrade or a crash
    /// (even SIGKILL), and the guest keeps its mount and fids. It must be
    /// on a tmpfs, owned by the daemon's user, not writable by group or
    /// others, not a symlink and outside --shared-dir, one per VM (else
    /// the start is refused); the daemon locks it while it runs.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Start without a saved state that cannot be used (damaged, cut
    /// short, another version or another export) instead of refusing to
    /// start; it is moved aside to session.state.refused (or
    /// session.snap.refused and session.journal.refused).
    #[arg(long, requires = "state_dir")]
    pub discard_bad_state: bool,

    /// Print the backend's capabilities as JSON and exit.
    #[arg(long)]
    pub print_capabilities: bool,
}

fn parse_workers(s: &str) -> Result<usize> {
    match s.parse::<usize>() {
        Ok(n) if n <= MAX_WORKERS => Ok(n),
        _ => Err(Error::ThreadPoolSize(s.to_owned())),
    }
}

/// Whether the raw command line asks for `--print-capabilities` (which a
/// VMM runs without any other option).
pub fn wants_capabilities<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(args: I) -> bool {
    args.into_iter()
        .any(|a| a.as_ref() == "--print-capabilities")
}

/// Runs the vhost-user daemon until SIGTERM/SIGINT: applies `--mlock`,
/// binds the socket, prints how to attach QEMU, serves.
pub fn run_daemon<F: Filesystem + 'static>(
    args: &VhostUserArgs,
    server: Arc<Server<F>>,
    readonly: bool,
    state: Option<&StateDir>,
    keeper: &FdStore,
) -> Result<()> {
    if args.queue_size == 0 || !args.queue_size.is_power_of_two() {
        return Err(Error::QueueSize(args.queue_size));
    }
    let (listen, defaulted) = match (&args.socket_path, args.fd) {
        (_, Some(fd)) => (Listen::Fd(fd), false),
        (Some(p), None) => (Listen::Path(p.clone()), false),
        (None, None) => (Listen::Path(PathBuf::from(DEFAULT_SOCKET_PATH)), true),
    };
    let mut config = DaemonConfig::default();
    config.listen = listen.clone();
    config.backend.tag = args.tag.clone();
    config.backend.queue_size = args.queue_size;
    config.backend.engine.workers = args.thread_pool_size;
    config.backend.engine.max_in_flight = usize::from(args.queue_size);
    config.backend.engine.offload = OffloadPolicy::Auto;
    // Each worker narrows its own seccomp filter (a no-op
    // unless the sandbox installed one).
    config.backend.engine.on_worker_start =
        Some(Arc::new(|| seccomp::enter_thread(ThreadKind::Worker)));
    config.backend.packed_ring = !args.no_packed_ring;
    if let Some(dir) = state {
        config.backend.state_dir = Some(dir.shared_fd()?);
    }
    config.stack_trim_interval = (args.stack_trim_interval_ms > 0)
        .then(|| std::time::Duration::from_millis(args.stack_trim_interval_ms));
    args.mlock.apply_process().map_err(|source| Error::Mlock {
        policy: args.mlock,
        source,
    })?;
    signals::install(state.is_some()).map_err(Error::Signals)?;
    let mut daemon = Daemon::new(Arc::clone(&server), config)?;
    if let Some(dir) = state {
        take_over(dir, &server, &mut daemon, args.discard_bad_state)?;
    }
    // Kept fds no restored fid claimed: their locks go.
    keeper.close_unclaimed();
    let _signals = signals::stop_on_signal(daemon.stop_handle());
    daemon.set_exit_on_disconnect(!args.keep_serving);
    let msize = daemon_msize(&daemon);
    match &listen {
        Listen::Path(p) => {
            info!(
                "vhost-user socket {} (tag {:?}, queue size {}, {} workers, msize up to {msize}{}, mlock {})",
                p.display(),
                args.tag,
                args.queue_size,
                args.thread_pool_size,
                if readonly { ", read-only" } else { "" },
                args.mlock
            );
            log_qemu_args(p, &args.tag, args.queue_size);
            if defaulted {
                println!("{}", attach_help(p, &args.tag, args.queue_size));
            }
        }
        Listen::Fd(fd) => info!(
            "vhost-user socket on inherited fd {fd} (tag {:?})",
            args.tag
        ),
        other => info!("vhost-user socket {other:?} (tag {:?})", args.tag),
    }
    daemon.run()?;
    if let (Some(dir), Some(saved)) = (state, daemon.take_handover()) {
        dir.write(&saved?)?;
        info!(
            "virtio-9p: handed over: session saved to {}; start the new daemon with the same --state-dir",
            dir.file().display()
        );
    }
    Ok(())
}

/// Restores the session a daemon that handed over left in `dir`, or
/// else the one a killed daemon left there, if any.
fn take_over<F: Filesystem + 'static>(
    dir: &StateDir,
    server: &Server<F>,
    daemon: &mut Daemon<F>,
    discard_bad: bool,
) -> Result<()> {
    let Some(bytes) = dir.read()? else {
        return recover(dir, daemon, discard_bad);
    };
    match server.restore_session(&bytes) {
        Ok(session) => {
            info!(
                "virtio-9p: taking over the session in {} ({} fids)",
                dir.file().display(),
                session.fid_count()
            );
            daemon.restore_session(session);
            dir.consume()
        }
        Err(source) if discard_bad => {
            warn!(
                "virtio-9p: starting without {}: {source}",
                dir.file().display()
            );
            dir.set_aside()
        }
        Err(source) => Err(Error::StateRefused {
            path: dir.file(),
            source,
        }),
    }
}

/// Takes over the session a killed daemon left in `dir`, if any.
fn recover<F: Filesystem + 'static>(
    dir: &StateDir,
    daemon: &mut Daemon<F>,
    discard_bad: bool,
) -> Result<()> {
    match daemon.recover_crashed_session() {
        Ok(Some(fids)) => {
            info!(
                "virtio-9p: taking over the session a stopped or killed daemon left in {} ({fids} fids)",
                dir.snapshot_file().display()
            );
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(source) if discard_bad => {
            warn!(
                "virtio-9p: starting without {}: {source}",
                dir.snapshot_file().display()
            );
            Ok(daemon.discard_crashed_session()?)
        }
        Err(source) => Err(Error::StateRefused {
            path: dir.snapshot_file(),
            source,
        }),
    }
}

fn daemon_msize<F: Filesystem + 'static>(d: &Daemon<F>) -> u32 {
    d.server().config().msize_max
}

/// Largest `vq_size` QEMU accepts (its `VIRTQUEUE_MAX_SIZE`).
const QEMU_MAX_VQ_SIZE: u16 = 1024;

/// The options that attach stock QEMU >= 10.2 (its user-creatable
/// `vhost-user-test-device-pci`) to the socket: guest RAM shared with the
/// daemon, the chardev and the device, whose `config_size` is the 9p
/// config space (le16 tag length, then the tag) and whose `vq_size` is at
/// most QEMU's 1024 and the daemon's `--queue-size`.
pub fn qemu_args(sock: &str, tag: &str, queue_size: u16) -> String {
    format!(
        "-m 1G -object memory-backend-memfd,id=mem,size=1G,share=on -machine q35,memory-backend=mem \
         -chardev socket,id=vu,path={sock} \
         -device vhost-user-test-device-pci,chardev=vu,virtio-id=9,num_vqs=1,config_size={},vq_size={}",
        2 + tag.len(),
        queue_size.min(QEMU_MAX_VQ_SIZE)
    )
}

/// Logs the QEMU options that attach the daemon listening on `socket`.
pub fn log_qemu_args(socket: &std::path::Path, tag: &str, queue_size: u16) {
    info!(
        "attach QEMU 10.2 or later with: {}",
        qemu_args(&absolute(socket), tag, queue_size)
    );
}

fn absolute(socket: &std::path::Path) -> String {
    std::fs::canonicalize(socket)
        .unwrap_or_else(|_| socket.to_path_buf())
        .display()
        .to_string()
}

/// How to attach QEMU to the socket (printed when only `--shared-dir` is given).
pub fn attach_help(socket: &std::path::Path, tag: &str, queue_size: u16) -> String {
    let sock = absolute(socket);
    format!(
        "virtio-9p-server: listening on {sock}\n\
         Attach QEMU 10.2 or later (older QEMU, cloud-hypervisor, crosvm: see the README):\n  \
         qemu-system-x86_64 {} ...\n\
         In the guest: mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 {tag} /mnt",
        qemu_args(&sock, tag, queue_size)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        v: VhostUserArgs,
    }

    #[test]
    fn test_defaults() {
        let t = T::try_parse_from(["x"]).unwrap();
        assert_eq!(t.v.queue_size, 1024);
        assert_eq!(t.v.thread_pool_size, DEFAULT_WORKERS);
        assert_eq!(t.v.mlock, MlockPolicy::Off);
        assert_eq!(t.v.tag, "share");
        assert!(t.v.socket_path.is_none() && t.v.fd.is_none());
    }

    #[test]
    fn test_bad_values_are_refused() {
        assert!(T::try_parse_from(["x", "--mlock", "sometimes"]).is_err());
        assert!(T::try_parse_from(["x", "--queue-size", "0"]).is_err());
        assert!(T::try_parse_from(["x", "--thread-pool-size", "-1"]).is_err());
        let big = (MAX_WORKERS + 1).to_string();
        assert!(T::try_parse_from(["x", "--thread-pool-size", big.as_str()]).is_err());
        assert!(T::try_parse_from(["x", "--socket-path", "a", "--fd", "3"]).is_err());
        let t = T::try_parse_from(["x", "--mlock", "on-fault", "--queue-size", "32768"]).unwrap();
        assert_eq!(t.v.mlock, MlockPolicy::OnFault);
    }

    #[test]
    fn test_zero_thread_pool_runs_inline() {
        // virtiofsd's "no thread pool": the engine's zero-worker mode runs
        // every call on the vring thread.
        let t = T::try_parse_from(["x", "--thread-pool-size", "0"]).unwrap();
        assert_eq!(t.v.thread_pool_size, 0);
        assert!(!t.v.keep_serving);
    }

    #[test]
    fn test_trim_interval_defaults_on_and_is_configurable() {
        let t = T::try_parse_from(["x"]).unwrap();
        assert_eq!(
            t.v.stack_trim_interval_ms,
            coro_pool::DEFAULT_TRIM_INTERVAL.as_millis() as u64
        );
        let t = T::try_parse_from(["x", "--stack-trim-interval-ms", "0"]).unwrap();
        assert_eq!(t.v.stack_trim_interval_ms, 0);
    }

    #[test]
    fn test_capabilities_and_help() {
        assert!(wants_capabilities(["prog", "--print-capabilities"]));
        assert!(!wants_capabilities(["prog", "--shared-dir", "d"]));
        let h = attach_help(std::path::Path::new("/nonexistent/s.sock"), "share", 1024);
        assert!(h.contains("config_size=7,vq_size=1024"), "{h}");
        assert!(h.contains("mount -t 9p -o trans=virtio"), "{h}");
    }

    #[test]
    fn test_qemu_args_fit_the_tag_and_queue_size() {
        assert_eq!(
            qemu_args("/run/9p.sock", "hostfiles", 32768),
            "-m 1G -object memory-backend-memfd,id=mem,size=1G,share=on \
             -machine q35,memory-backend=mem \
             -chardev socket,id=vu,path=/run/9p.sock \
             -device vhost-user-test-device-pci,chardev=vu,virtio-id=9,num_vqs=1,\
             config_size=11,vq_size=1024"
        );
        let a = qemu_args("s", &"t".repeat(254), 256);
        assert!(a.ends_with(",config_size=256,vq_size=256"), "{a}");
    }
}
