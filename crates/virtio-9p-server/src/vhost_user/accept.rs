// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon loop: accept a frontend, serve it, wait for the next.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coro_pool::{PoolConfig, StackPool};
use log::{error, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::backend::{BackendConfig, Virtio9pBackend};
use super::VhostUserError;
use crate::engine::{EngineError, DEFAULT_STACK_SIZE};
use crate::error::Result;
use crate::fs::Filesystem;
use crate::server::{Server, Session};
use crate::sys::poll_in;

/// The socket used when only `--shared-dir` is given.
pub const DEFAULT_SOCKET_PATH: &str = "virtio-9p.sock";

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Listen {
    /// Bind an owner-only unix socket at this path; only a stale socket
    /// there is replaced ([`crate::transport::unix::bind`]).
    Path(PathBuf),
    /// A listening unix socket inherited from the parent (`--fd`).
    Fd(RawFd),
}

/// Daemon settings. Build one from [`DaemonConfig::default`] and set the
/// fields that differ: the struct is `#[non_exhaustive]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DaemonConfig {
    /// The socket.
    pub listen: Listen,
    /// The device.
    pub backend: BackendConfig,
    /// The coroutine stack pool policy (`NoPool` maps a stack per request).
    pub stack_policy: coro_pool::Policy,
    /// How often the stack pool frees idle stacks above recent demand
    /// (`--stack-trim-interval-ms`; default
    /// [`coro_pool::DEFAULT_TRIM_INTERVAL`], `None` for never).
    pub stack_trim_interval: Option<std::time::Duration>,
}

impl Default for DaemonConfig {
    /// The socket [`DEFAULT_SOCKET_PATH`](super::DEFAULT_SOCKET_PATH), the
    /// default [`BackendConfig`], a [`coro_pool::Policy::Bounded`] stack
    /// pool trimmed every [`coro_pool::DEFAULT_TRIM_INTERVAL`].
    fn default() -> Self {
        DaemonConfig {
            listen: Listen::Path(PathBuf::from(super::DEFAULT_SOCKET_PATH)),
            backend: BackendConfig::default(),
            stack_policy: coro_pool::Policy::Bounded,
            stack_trim_interval: Some(coro_pool::DEFAULT_TRIM_INTERVAL),
        }
    }
}

/// Makes the current device finish its requests and take no more.
type Freeze = Box<dyn Fn() + Send + Sync>;

struct StopState {
    flag: AtomicBool,
    wake: EventFd,
    conn: Mutex<Option<ShutdownHandle>>,
    /// A handover was asked for ([`StopHandle::hand_over`]).
    handover: AtomicBool,
    handover_wake: EventFd,
    /// Freezes the device of the current connection.
    freeze: Mutex<Option<Freeze>>,
}

/// Stops a running [`Daemon`] from any thread: the current connection is
/// shut down and [`Daemon::run`] returns `Ok`.
#[derive(Clone)]
pub struct StopHandle(Arc<StopState>);

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopHandle")
            .field("stopped", &self.0.flag.load(Ordering::Relaxed))
            .finish()
    }
}

impl StopHandle {
    /// Requests the stop.
    pub fn stop(&self) {
        self.0.flag.store(true, Ordering::Release);
        let _ = self.0.wake.write(1);
        if let Some(h) = self
            .0
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            h.shutdown();
        }
    }

    /// The stop eventfd. Writing an 8-byte 1 to it (write(2) is
    /// async-signal-safe) stops the daemon as [`StopHandle::stop`] does:
    /// this is what a signal handler of the embedder may do. The fd lives
    /// as long as any clone of the handle.
    pub fn wake_fd(&self) -> RawFd {
        self.0.wake.as_raw_fd()
    }

    /// Whether a stop was requested.
    pub fn is_stopped(&self) -> bool {
        self.0.flag.load(Ordering::Acquire)
    }

    /// A planned handover to a new daemon (an upgrade): the device
    /// finishes every request in flight and takes no more (waiting Tlocks
    /// answer BLOCKED), the connection is closed, and [`Daemon::run`]
    /// returns with the session saved ([`Daemon::take_handover`]). The
    /// frontend then finds every chain it made available either answered
    /// or not yet taken, so a new daemon started with the state
    /// ([`Daemon::restore_session`]) loses and repeats nothing.
    pub fn hand_over(&self) {
        self.0.handover.store(true, Ordering::Release);
        let freeze = self.0.freeze.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = freeze.as_ref() {
            f();
        }
        drop(freeze);
        self.stop();
    }

    /// The handover eventfd: writing an 8-byte 1 to it (async-signal-safe)
    /// asks for [`StopHandle::hand_over`], as the binary's SIGUSR1 handler
    /// does.
    pub fn handover_fd(&self) -> RawFd {
        self.0.handover_wake.as_raw_fd()
    }
}

/// The vhost-user daemon: a listening socket, a filesystem server and a
/// coroutine stack pool, serving one frontend at a time.
pub struct Daemon<F: Filesystem> {
    server: Arc<Server<F>>,
    config: DaemonConfig,
    pool: Arc<StackPool>,
    listener: Listener,
    stop: StopHandle,
    connections: AtomicU64,
    /// Whether [`Daemon::run`] returns when the first frontend leaves.
    exit_on_disconnect: bool,
    /// The socket file [`Listen::Path`] created, removed on drop.
    _socket_file: Option<SocketFile>,
    /// The session the next connection takes over.
    restored: Option<Arc<Session<F>>>,
    /// The saved session of a handover.
    handover: Option<Result<Vec<u8>>>,
    /// `restored` came from a killed daemon's crash-safe state.
    recovered: bool,
}

/// Removes the socket file it names when dropped.
#[derive(Debug)]
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl<F: Filesystem> std::fmt::Debug for Daemon<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("config", &self.config)
            .finish()
    }
}

impl<F: Filesystem + 'static> Daemon<F> {
    /// Binds the socket (or takes over `--fd`) and checks the device
    /// settings; nothing is served until [`Daemon::run`].
    pub fn new(server: Arc<Server<F>>, config: DaemonConfig) -> Result<Self> {
        // Validate the device settings before touching the socket.
        let pool = Arc::new(
            StackPool::new(
                PoolConfig::default()
                    .stack_size(DEFAULT_STACK_SIZE)
                    .policy(config.stack_policy)
                    .trim_interval(config.stack_trim_interval),
            )
            .map_err(EngineError::StackPool)?,
        );
        drop(Virtio9pBackend::new(
            Arc::clone(&server),
            Arc::clone(&pool),
            &config.backend,
        )?);
        let listener = match &config.listen {
            Listen::Path(p) => crate::transport::unix::bind(p, Default::default())
                .map(Listener::from)
                .map_err(|e| VhostUserError::Listen {
                    what: p.display().to_string(),
                    source: vhost::vhost_user::Error::SocketError(e),
                })?,
            Listen::Fd(fd) => {
                // SAFETY: fstat on an arbitrary fd number only writes `st`.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                let ok = *fd >= 0 && {
                    // SAFETY: as above; an invalid fd just fails with EBADF.
                    let r = unsafe { libc::fstat(*fd, &mut st) };
                    r == 0
                };
                if !ok || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
                    return Err(VhostUserError::BadFd(*fd).into());
                }
                // SAFETY: the caller hands the fd over (`--fd`): it is an
                // open socket (checked above) that nothing else owns.
                unsafe { Listener::from_raw_fd(*fd) }
            }
        };
        let socket_file = match &config.listen {
            Listen::Path(p) => Some(SocketFile(p.clone())),
            Listen::Fd(_) => None,
        };
        Ok(Daemon {
            server,
            config,
            pool,
            listener,
            stop: StopHandle(Arc::new(StopState {
                flag: AtomicBool::new(false),
                wake: EventFd::new(EFD_NONBLOCK).map_err(VhostUserError::DaemonIo)?,
                conn: Mutex::new(None),
                handover: AtomicBool::new(false),
                handover_wake: EventFd::new(EFD_NONBLOCK).map_err(VhostUserError::DaemonIo)?,
                freeze: Mutex::new(None),
            })),
            connections: AtomicU64::new(0),
            exit_on_disconnect: false,
            _socket_file: socket_file,
            restored: None,
            handover: None,
            recovered: false,
        })
    }

    /// A handle that stops [`Daemon::run`].
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Makes [`Daemon::run`] return `Ok` once a frontend has connected and
    /// disconnected (what the binary does unless `--keep-serving`), rather
    /// than wait for the next one (the default of the library).
    pub fn set_exit_on_disconnect(&mut self, exit: bool) {
        self.exit_on_disconnect = exit;
    }

    /// Makes the next frontend connection take over `session` (from
    /// [`Server::restore_session`]) instead of starting a fresh one: the
    /// guest of a daemon that handed over goes on with its fids.
    pub fn restore_session(&mut self, session: Session<F>) {
        self.restored = Some(Arc::new(session));
    }

    /// Takes over the session a killed daemon left in the state directory
    /// ([`BackendConfig::state_dir`]): its last snapshot with the journal
    /// of the fid changes made since, restored as
    /// [`Daemon::restore_session`] does; the next frontend connection
    /// goes on with it. Returns the fids brought back, or `None` when the
    /// directory holds no such state (or there is no directory).
    ///
    /// State that is not state, damaged, of another version or of
    /// another export is refused ([`Error::State`](crate::Error::State)): fix or remove it, or
    /// set it aside with [`Daemon::discard_crashed_session`].
    pub fn recover_crashed_session(&mut self) -> Result<Option<usize>> {
        let Some(dir) = self.config.backend.state_dir.clone() else {
            return Ok(None);
        };
        let Some(session) = self.server.recover_session(dir.as_fd())? else {
            return Ok(None);
        };
        let n = session.fid_count();
        self.restored = Some(Arc::new(session));
        self.recovered = true;
        Ok(Some(n))
    }

    /// Moves crash state that [`Daemon::recover_crashed_session`] refused
    /// aside (`session.snap.refused`, `session.journal.refused`), so the
    /// daemon starts without it.
    pub fn discard_crashed_session(&self) -> Result<()> {
        match &self.config.backend.state_dir {
            Some(dir) => self.server.clear_session_state(dir.as_fd(), true),
            None => Ok(()),
        }
    }

    /// After [`Daemon::run`] returned for a [`StopHandle::hand_over`]:
    /// the saved session (from [`Server::save_session`]) to give the next
    /// daemon, or why it could not be saved. `None` when there was no
    /// handover, or no session to hand over.
    pub fn take_handover(&mut self) -> Option<Result<Vec<u8>>> {
        self.handover.take()
    }

    /// Frontend connections served so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// The 9P server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// The coroutine stack pool (shared by all connections).
    pub fn stack_pool(&self) -> &Arc<StackPool> {
        &self.pool
    }

    /// Serves frontends one after another until stopped. A disconnect is a
    /// normal end of one connection; the daemon then waits for the next.
    pub fn run(&mut self) -> Result<()> {
        let watcher = {
            let stop = self.stop.clone();
            std::thread::Builder::new()
                .name("9p-stop-watcher".into())
                .spawn(move || watch_stop(&stop))
                .map_err(VhostUserError::DaemonIo)?
        };
        let result = self.serve_loop();
        // End the watcher (it waits for a stop that may never come).
        self.stop.0.flag.store(true, Ordering::Release);
        let _ = self.stop.0.wake.write(1);
        let _ = watcher.join();
        result
    }

    fn serve_loop(&mut self) -> Result<()> {
        loop {
            if !self.wait_for_client()? {
                if self.stop.0.handover.load(Ordering::Acquire) {
                    // Nobody took the restored session over yet: pass it on.
                    if let Some(s) = self.restored.take() {
                        self.handover = Some(self.server.save_session(&s));
                    }
                }
                info!("virtio-9p: stopping");
                return Ok(());
            }
            let backend = Arc::new(Virtio9pBackend::new(
                Arc::clone(&self.server),
                Arc::clone(&self.pool),
                &self.config.backend,
            )?);
            let mut daemon = VhostUserDaemon::new(
                "virtio-9p".into(),
                Arc::clone(&backend),
                GuestMemoryAtomic::new(GuestMemoryMmap::<super::DirtyLog>::new()),
            )?;
            for h in daemon.get_epoll_handlers() {
                backend.register(&h)?;
            }
            if let Some(session) = self.restored.take() {
                info!("virtio-9p: this connection takes over the saved session");
                backend.set_session(session);
            }
            backend.set_recovering(std::mem::take(&mut self.recovered));
            backend.start_journal();
            if let Err(e) = daemon.start(&mut self.listener) {
                warn!("virtio-9p: accepting a frontend failed: {e}");
                backend.shutdown();
                // The backend's drop closes the exit-event fds the daemon
                // leaked, once the daemon (holding Arcs of it) is gone.
                drop(daemon);
                drop(backend);
                continue;
            }
            let n = self.connections.fetch_add(1, Ordering::Relaxed) + 1;
            info!("virtio-9p: frontend {n} connected");
            *self.stop.0.conn.lock().unwrap_or_else(|e| e.into_inner()) = daemon.shutdown_handle();
            {
                let b = Arc::clone(&backend);
                *self.stop.0.freeze.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Box::new(move || b.freeze()));
            }
            if self.stop.is_stopped() {
                daemon.request_shutdown();
            }
            let result = daemon.wait();
            *self.stop.0.freeze.lock().unwrap_or_else(|e| e.into_inner()) = None;
            *self.stop.0.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
            backend.shutdown();
            if self.stop.0.handover.load(Ordering::Acquire) {
                self.handover = Some(self.server.save_session(&backend.session()));
                drop(daemon);
                drop(backend);
                info!("virtio-9p: frontend {n}: handed over");
                return Ok(());
            }
            if !self.stop.is_stopped() {
                // The frontend left: its session is over. (A stopped
                // daemon keeps it for a successor, as a killed one does.)
                backend.end_journal();
            }
            drop(daemon);
            drop(backend);
            // A frontend that quits closes the socket, often mid-message:
            // that is how QEMU ends, not an error.
            match result {
                Ok(())
                | Err(vhost_user_backend::Error::HandleRequest(
                    vhost::vhost_user::Error::Disconnected
                    | vhost::vhost_user::Error::PartialMessage,
                )) => info!("virtio-9p: frontend {n} disconnected"),
                Err(e) => warn!("virtio-9p: frontend {n} ended: {e}"),
            }
            if self.exit_on_disconnect {
                info!("virtio-9p: the frontend left; exiting");
                return Ok(());
            }
        }
    }

    /// Waits until a frontend connects (true) or a stop is requested (false).
    fn wait_for_client(&self) -> Result<bool> {
        loop {
            if self.stop.is_stopped() {
                return Ok(false);
            }
            let [listener, _] = poll_in(
                [self.listener.as_raw_fd(), self.stop.0.wake.as_raw_fd()],
                Duration::from_secs(1),
            )
            .map_err(VhostUserError::DaemonIo)?;
            if self.stop.is_stopped() {
                return Ok(false);
            }
            if listener & libc::POLLIN != 0 {
                return Ok(true);
            }
            if listener & (libc::POLLERR | libc::POLLNVAL) != 0 {
                error!("virtio-9p: the listening socket failed");
                return Err(VhostUserError::DaemonIo(std::io::Error::from_raw_os_error(
                    libc::EBADF,
                ))
                .into());
            }
        }
    }
}

/// Waits for the stop eventfd (written by [`StopHandle::stop`] or a
/// signal) and then shuts the current connection down.
fn watch_stop(stop: &StopHandle) {
    loop {
        let ready = poll_in(
            [stop.0.wake.as_raw_fd(), stop.0.handover_wake.as_raw_fd()],
            Duration::from_secs(1),
        )
        .unwrap_or_default();
        if ready[1] & libc::POLLIN != 0 {
            let _ = stop.0.handover_wake.read();
            stop.hand_over();
            return;
        }
        if ready.iter().any(|&e| e != 0) || stop.is_stopped() {
            // Do not consume the event: the accept loop polls it too.
            stop.stop();
            return;
        }
    }
}
