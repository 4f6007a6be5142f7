// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `virtio-9p-server` binary: serves a directory over 9P2000.L.

mod daemon;

use std::ffi::CString;
use std::os::fd::IntoRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use log::{info, warn};

use virtio_9p_server::fs::ids::{IdRules, IdTranslation};
use virtio_9p_server::fs::Filesystem;
use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketError, SocketLimits};
use virtio_9p_server::transport::unix;
use virtio_9p_server::{
    Config, LockKeeper, PassthroughConfig, PassthroughError, PassthroughFs, SecurityModel, Server,
};

use daemon::cli::{self, Cli};
use daemon::keeper::{FdStore, Inherited};
use daemon::pidfile::PidFile;
use daemon::sandbox::{self as sb, caps, limits, seccomp, SandboxConfig, SandboxMode};
use daemon::{syslog, vhost_mode};
use daemon::{Error, Result};

/// The filesystem the binary serves: the passthrough, which applies the
/// id translation of `--translate-uid`/`--translate-gid` itself.
type Fs = PassthroughFs;

/// Everything before serving that the sandbox orders: the fd limit and fid
/// budget, then (with the sockets already bound by the caller) the
/// sandbox, in which the export is opened, then capabilities, seccomp and
/// the test hooks. Returns the server to run.
fn harden(
    cli: &Cli,
    sessions: usize,
    cleanup_socket: Option<PathBuf>,
    cleanup_files: Vec<PathBuf>,
    keeper: Option<Arc<dyn LockKeeper>>,
) -> Result<Arc<Server<Fs>>> {
    let h = &cli.hardening;
    let nofile = limits::set_nofile(h.rlimit_nofile)?;
    let max_open_fids =
        limits::open_fid_budget(nofile, sessions, virtio_9p_server::DEFAULT_MAX_FIDS);
    if max_open_fids < limits::MIN_FIDS {
        return Err(Error::FidBudget {
            nofile,
            max_fids: max_open_fids,
            sessions,
        });
    }
    let shared_dir =
        std::fs::canonicalize(&cli.shared_dir).map_err(|source| PassthroughError::SharedDir {
            path: cli.shared_dir.clone(),
            source,
        })?;
    let mut pcfg = PassthroughConfig::new(&shared_dir);
    pcfg.readonly = cli.readonly;
    pcfg.inline_metadata = !cli.no_inline_metadata;
    pcfg.security_model = cli.security_model;
    pcfg.export_name = cli.export_name.clone();
    pcfg.migration_mode = cli.migration_mode;
    pcfg.max_path_fds = limits::path_fd_budget(nofile);
    let ids = id_translation(cli)?;
    let mut scfg = SandboxConfig::new(h.sandbox, &shared_dir);
    scfg.uid_map = h.uid_map.clone();
    scfg.gid_map = h.gid_map.clone();
    scfg.cleanup_socket = cleanup_socket;
    scfg.cleanup_files = cleanup_files;
    // The coroutine stacks' mapping budget needs vm.max_map_count and the
    // process's /proc/self/maps, which the sandbox hides: read the limit
    // now, open the maps where the sandbox's own /proc still shows this
    // process (after the namespace mode's fork).
    let max_map_count = stack_budget_limit();
    let (fs, maps) = sb::enter(&scfg, || {
        let maps = coro_pool::MapsSource::open();
        PassthroughFs::new(pcfg)
            .map(|fs| (fs.with_ids(ids), maps))
            .map_err(virtio_9p_server::Error::from)
    })?;
    install_stack_budget(max_map_count, maps);
    // Inside the namespace and chroot sandboxes the current directory is
    // the detached /proc/self/fd.
    fs.set_proc_fd_is_cwd(sb::proc_fd_is_cwd());
    let mut keep = caps::CapSet::of(caps::for_model(cli.security_model, cli.readonly));
    if cli.listen.is_none() && cli.vhost.mlock != mlock_policy::MlockPolicy::Off {
        keep = caps::CapSet(keep.0 | 1 << caps::CAP_IPC_LOCK);
    }
    if let Some(m) = &h.modcaps {
        keep = keep.modify(m)?;
    }
    let kept = caps::drop_to(keep)?;
    seccomp::apply(h.seccomp)?;
    info!(
        "sandbox {}, seccomp {}, capabilities [{}], RLIMIT_NOFILE {nofile}, {max_open_fids} open fids per session",
        h.sandbox,
        h.seccomp,
        kept.names()
    );
    info!(
        "metadata calls {}",
        if fs.metadata_is_local() {
            "inline (the shared dir is on a local filesystem)"
        } else {
            "on workers"
        }
    );
    for hook in &h.test_hook {
        run_test_hook(hook);
    }
    let config = {
        let mut cfg = Config::sized_to_process();
        cfg.msize_max = cli.msize_max;
        cfg.max_open_fids = max_open_fids;
        cfg.lock_keeper = keeper;
        cfg
    };
    Ok(Arc::new(Server::new(fs, config)?))
}

/// `vm.max_map_count`, read before the sandbox hides `/proc/sys`.
fn stack_budget_limit() -> u64 {
    coro_pool::MaxMapCount::Proc.read().unwrap_or_else(|e| {
        warn!(
            "cannot read {} ({e}); coroutine stacks are budgeted against the kernel default \
             vm.max_map_count = {}",
            coro_pool::MAX_MAP_COUNT_PATH,
            coro_pool::FALLBACK_MAX_MAP_COUNT
        );
        coro_pool::FALLBACK_MAX_MAP_COUNT
    })
}

/// Makes the budget every coroutine pool of the daemon draws from count
/// against `max_map_count` and through `maps` (opened before the sandbox
/// hid `/proc`), so that it stays exact inside. Called before any pool
/// exists.
fn install_stack_budget(max_map_count: u64, maps: std::io::Result<coro_pool::MapsSource>) {
    use coro_pool::{MapsSource, MaxMapCount, ProcessBudget, DEFAULT_VMA_RESERVE};
    let maps = maps.unwrap_or_else(|e| {
        warn!("cannot open /proc/self/maps ({e}); the coroutine stacks' budget counts only them");
        MapsSource::Proc
    });
    let budget =
        ProcessBudget::with_maps(MaxMapCount::Fixed(max_map_count), DEFAULT_VMA_RESERVE, maps);
    if let Some(c) = budget.check() {
        info!(
            "coroutine stacks: vm.max_map_count {max_map_count}, {} VMAs mapped, \
             /proc/self/maps kept open",
            c.process_vmas
        );
    }
    if ProcessBudget::set_process(budget).is_err() {
        warn!("the coroutine stack budget was made before the sandbox; it may not count mappings");
    }
}

/// The `--translate-uid` / `--translate-gid` rules, checked for overlaps.
fn id_translation(cli: &Cli) -> Result<IdTranslation> {
    let h = &cli.hardening;
    let rules = |flag, list: &[_]| {
        IdRules::new(list.to_vec()).map_err(|source| Error::Translation {
            flag,
            source: source.into(),
        })
    };
    let mut ids = IdTranslation::default();
    ids.uid = rules("--translate-uid", &h.translate_uid)?;
    ids.gid = rules("--translate-gid", &h.translate_gid)?;
    Ok(ids)
}

/// Files the signal handler of socket mode removes before it exits
/// (`--sandbox none` only: elsewhere the paths do not lead to them).
static CLEANUP: OnceLock<Vec<CString>> = OnceLock::new();

/// Removes `files` with unlinkat(2), which is async-signal-safe and on the
/// seccomp list (std's remove_file uses unlink(2), which is not).
fn remove_files(files: &[CString]) {
    for f in files {
        // SAFETY: a valid C string; unlinkat only reads it.
        unsafe { libc::unlinkat(libc::AT_FDCWD, f.as_ptr(), 0) };
    }
}

fn c_paths(paths: &[&Path]) -> Vec<CString> {
    paths
        .iter()
        .filter_map(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .collect()
}

/// An absolute form of `p` (the namespace supervisor removes it later).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The integration tests' hooks (hidden `--test-hook`, harmless: see
/// its doc in `daemon/cli.rs`), run once the process is confined.
fn run_test_hook(hook: &str) {
    if hook == "forbidden-syscall" {
        // personality(0xffffffff) only queries, but it is not on the list.
        // SAFETY: a query that changes nothing.
        let r = unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) };
        eprintln!("test-hook: forbidden syscall returned {r}");
    } else if let Some(path) = hook.strip_prefix("probe:") {
        match std::fs::symlink_metadata(path) {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                eprintln!("test-hook: probe {path} dev={} ino={}", m.dev(), m.ino());
            }
            Err(e) => eprintln!(
                "test-hook: probe {path} errno={}",
                e.raw_os_error().unwrap_or(0)
            ),
        }
    } else if hook == "budget" {
        // The coroutine stacks' budget as counted inside the sandbox; then
        // wait for a byte on stdin, so that a test can count the process's
        // mappings from outside while nothing changes them.
        let budget = coro_pool::ProcessBudget::process();
        let limit = budget.limit_vmas();
        let vmas = budget.check().map_or(0, |c| c.process_vmas);
        eprintln!(
            "test-hook: budget max_map_count={} process_vmas={vmas} limit_vmas={limit}",
            budget.stats().max_map_count
        );
        let mut go = [0u8; 1];
        // SAFETY: reads at most one byte into a buffer we own.
        unsafe { libc::read(0, go.as_mut_ptr().cast(), 1) };
    } else {
        eprintln!("test-hook: unknown hook {hook:?}");
    }
}

/// Closes every inherited fd above stderr but `--fd` and `keep` (the
/// lock keeper's `LISTEN_FDS`): a leaked descriptor (a directory of the
/// host, say) would be a way out of any sandbox.
fn close_inherited_fds(fd: Option<i32>, keep: &[i32]) {
    let mut spare: Vec<u32> = fd
        .into_iter()
        .chain(keep.iter().copied())
        .filter_map(|k| u32::try_from(k).ok())
        .filter(|k| *k > 2)
        .collect();
    spare.sort_unstable();
    spare.dedup();
    let mut first = 3u32;
    for k in spare.into_iter().chain([u32::MAX]) {
        if first < k {
            // SAFETY: nothing in the process holds these fds yet (main has
            // just started); close_range only closes.
            unsafe { libc::syscall(libc::SYS_close_range, first, k - 1, 0) };
        }
        first = k.saturating_add(1);
    }
}

/// Exits with status 0 on SIGTERM, SIGINT and SIGHUP in socket mode,
/// removing the [`CLEANUP`] files: as pid 1 of its namespace the daemon
/// would otherwise ignore them, and outside one SIGHUP would kill it
/// without cleanup.
fn exit_on_signals() {
    extern "C" fn on_signal(_: libc::c_int) {
        if let Some(files) = CLEANUP.get() {
            remove_files(files);
        }
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(0) };
    }
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; the handler only calls _exit.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    sb::unblock_stop_signals();
}

/// What `--socket-group` asks for.
fn socket_perms(cli: &Cli) -> Result<unix::SocketPerms> {
    let mut perms = unix::SocketPerms::default();
    if let Some(g) = &cli.socket_group {
        perms.group = Some(cli::group_id(g).map_err(|source| Error::SocketGroup {
            group: g.clone(),
            source,
        })?);
    }
    Ok(perms)
}

/// Refuses (or, with the opt-in, warns about) a TCP export that gives
/// whoever connects the host's ownership and modes.
fn check_tcp_exposure(cli: &Cli) -> Result<()> {
    if cli.readonly || cli.security_model == SecurityModel::MappedXattr {
        return Ok(());
    }
    if !cli.allow_unauthenticated_tcp_passthrough {
        return Err(Error::TcpPassthrough(cli.security_model));
    }
    warn!(
        "--allow-unauthenticated-tcp-passthrough: anyone who can connect may change the \
         export with security model {}",
        cli.security_model
    );
    Ok(())
}

/// Socket mode: bind, then serve every client on the socket threads.
fn run_socket(cli: &Cli, addr: &ListenAddr) -> Result<()> {
    // Lock the pid file, then bind: both live outside the export.
    let mut pid_file = None;
    let listener = match addr {
        ListenAddr::Unix(p) => {
            let perms = socket_perms(cli)?;
            let pid = PidFile::acquire(p, std::process::id())?;
            match unix::bind(p, perms) {
                Ok(l) => {
                    pid_file = Some(pid);
                    Listener::Unix(l)
                }
                Err(e) => {
                    pid.remove();
                    return Err(listen_error(addr.to_string(), e));
                }
            }
        }
        _ => {
            if cli.socket_group.is_some() {
                return Err(Error::SocketGroupNotUnix);
            }
            check_tcp_exposure(cli)?;
            Listener::bind(addr)?
        }
    };
    let bound = listener
        .local_addr()
        .map_err(|e| listen_error(addr.to_string(), e))?;
    let cleanup = match addr {
        ListenAddr::Unix(p) => Some(absolute(p)),
        _ => None,
    };
    let pid_path: Vec<PathBuf> = pid_file.iter().map(|f| absolute(f.path())).collect();
    let sandbox = cli.hardening.sandbox;
    if sandbox == SandboxMode::None {
        let mut files: Vec<&Path> = cleanup.iter().map(PathBuf::as_path).collect();
        files.extend(pid_path.iter().map(PathBuf::as_path));
        let _ = CLEANUP.set(c_paths(&files));
    }
    let server = harden(cli, limits::BUDGETED_CLIENTS, cleanup, pid_path, None)?;
    exit_on_signals();
    info!(
        "serving {} on {bound} (security model {}, {}msize up to {})",
        cli.shared_dir.display(),
        cli.security_model,
        if cli.readonly { "read-only, " } else { "" },
        cli.msize_max
    );
    let mut limits = SocketLimits::default();
    limits.workers = cli.vhost.thread_pool_size;
    let result = listener.serve_with(server, limits).map_err(Error::from);
    if let Some(files) = CLEANUP.get() {
        remove_files(files);
    }
    drop(pid_file);
    result
}

/// vhost-user mode (no --listen): the daemon of `virtio_9p_server::vhost_user`.
fn run_vhost_user(cli: &Cli, store: Arc<FdStore>) -> Result<()> {
    let mut args = cli.vhost.clone();
    // Opened (checked and locked) before the socket is bound, so a state
    // directory that is refused leaves nothing behind, and before the
    // sandbox hides it.
    let state = args
        .state_dir
        .as_deref()
        .map(|d| daemon::state_dir::StateDir::open(d, &cli.shared_dir))
        .transpose()?;
    let mut cleanup = None;
    let mut pid_file = None;
    if args.fd.is_none() {
        // Bind the socket before the sandbox hides its directory (and
        // before seccomp forbids bind), and hand it over as an inherited fd.
        let defaulted = args.socket_path.is_none();
        let path = args
            .socket_path
            .take()
            .unwrap_or_else(|| PathBuf::from(virtio_9p_server::vhost_user::DEFAULT_SOCKET_PATH));
        let perms = socket_perms(cli)?;
        // The lock comes first: a second instance must leave the socket of
        // the running one alone.
        let pid = PidFile::acquire(&path, std::process::id())?;
        let listener = match unix::bind(&path, perms) {
            Ok(l) => l,
            Err(e) => {
                pid.remove();
                return Err(listen_error(path.display().to_string(), e));
            }
        };
        pid_file = Some(pid);
        info!("vhost-user socket {}", path.display());
        vhost_mode::log_qemu_args(&path, &args.tag, args.queue_size);
        if defaulted {
            println!(
                "{}",
                vhost_mode::attach_help(&path, &args.tag, args.queue_size)
            );
        }
        args.fd = Some(listener.into_raw_fd());
        cleanup = Some(std::fs::canonicalize(&path).unwrap_or(path));
    }
    let sandbox = cli.hardening.sandbox;
    let pid_path: Vec<PathBuf> = pid_file.iter().map(|f| absolute(f.path())).collect();
    // The namespace supervisor removes the socket and the pid file; chroot
    // cannot reach them (a stale socket is replaced and a stale pid file,
    // whose lock died with its daemon, is reused at the next start).
    let namespaced = sandbox == SandboxMode::Namespace;
    // The lock keeper matters only where a session outlives the process.
    let keeper = (state.is_some() && store.can_keep()).then(|| Arc::clone(&store));
    if state.is_some() && keeper.is_none() {
        warn!(
            "no lock keeper (NOTIFY_SOCKET is not set): after a crash the guest's locks are taken \
             again, and a host process may take one in the gap; see \"Locks across a crash\" in \
             docs/virtio-9p-daemon.md"
        );
    }
    let server = harden(
        cli,
        1,
        cleanup.clone().filter(|_| namespaced),
        if namespaced {
            pid_path.clone()
        } else {
            Vec::new()
        },
        keeper.map(|k| k as Arc<dyn LockKeeper>),
    )?;
    // After the sandbox's fork: the sending thread lives in the server.
    store.start().map_err(Error::LockKeeper)?;
    let result = vhost_mode::run_daemon(&args, server, cli.readonly, state.as_ref(), &store);
    if sandbox == SandboxMode::None {
        let mut files: Vec<&Path> = cleanup.iter().map(PathBuf::as_path).collect();
        files.extend(pid_path.iter().map(PathBuf::as_path));
        remove_files(&c_paths(&files));
    }
    drop(pid_file);
    result
}

/// A socket that cannot be bound (or read back): the library's
/// [`SocketError::Listen`], as `Listener::bind` reports it.
fn listen_error(addr: String, source: std::io::Error) -> Error {
    SocketError::Listen { addr, source }.into()
}

fn main() -> ExitCode {
    if vhost_mode::wants_capabilities(std::env::args_os().skip(1)) {
        println!("{}", vhost_mode::CAPABILITIES_JSON);
        return ExitCode::SUCCESS;
    }
    let (cli, matches) = cli::parse();
    // The fds a lock keeper passed back (vhost-user mode only: a socket
    // server restores no session).
    let listen = if cli.listen.is_none() {
        let var = |k| std::env::var(k).ok();
        daemon::keeper::parse_listen(
            var("LISTEN_PID").as_deref(),
            var("LISTEN_FDS").as_deref(),
            var("LISTEN_FDNAMES").as_deref(),
            std::process::id(),
        )
    } else {
        Ok(Inherited::default())
    };
    close_inherited_fds(
        cli.vhost.fd,
        &listen.as_ref().map(Inherited::fds).unwrap_or_default(),
    );
    if let Err(e) = cli::check_mode(&cli, &matches).and_then(|()| id_translation(&cli).map(drop)) {
        eprintln!("virtio-9p-server: {e}");
        return ExitCode::FAILURE;
    }
    if cli.syslog {
        let logger = syslog::Syslog::connect(
            Path::new(syslog::DEV_LOG),
            "virtio-9p-server",
            cli.log_level,
        )
        .map_err(|source| Error::SyslogConnect {
            path: syslog::DEV_LOG,
            source,
        })
        .and_then(|l| l.install().map_err(Error::SyslogInstall));
        if let Err(e) = logger {
            eprintln!("virtio-9p-server: {e}");
            return ExitCode::FAILURE;
        }
    } else {
        env_logger::Builder::new()
            .filter_level(cli.log_level)
            .format_timestamp_millis()
            .init();
    }
    let inherited = listen.unwrap_or_else(|e| {
        warn!("lock keeper: {e}");
        Inherited::default()
    });
    let result = match &cli.listen {
        Some(addr) => run_socket(&cli, addr),
        None => run_vhost_user(&cli, Arc::new(FdStore::from_env(inherited))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virtio-9p-server: {e}");
            ExitCode::FAILURE
        }
    }
}
