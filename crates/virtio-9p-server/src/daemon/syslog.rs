// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--syslog`: a small [`log::Log`] that sends RFC 3164 datagrams to
//! `/dev/log`.
//!
//! The socket is connected before the sandbox, so it keeps working after
//! `pivot_root` hides `/dev/log`, and messages go out with `write(2)`,
//! which the worker threads' seccomp filter allows (they may not call
//! `sendto`). glibc's `syslog(3)` would reconnect with `socket` and
//! `connect` after an error, which the filters forbid; no crate on the
//! dependency list sends through an already-connected fd with `write`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// Where syslog listens.
pub const DEV_LOG: &str = "/dev/log";

/// Facility `daemon` (3), shifted as RFC 3164 wants it.
const LOG_DAEMON: u8 = 3 << 3;

/// The longest message sent; longer ones are cut (at a character boundary).
const MAX_MESSAGE: usize = 4096;

/// The logger.
#[derive(Debug)]
pub struct Syslog {
    fd: OwnedFd,
    ident: String,
    pid: u32,
    level: log::LevelFilter,
}

impl Syslog {
    /// Connects to the syslog socket at `path`.
    pub fn connect(path: &Path, ident: &str, level: log::LevelFilter) -> io::Result<Syslog> {
        let sock = UnixDatagram::unbound()?;
        sock.connect(path)?;
        Ok(Syslog {
            fd: sock.into(),
            ident: ident.to_owned(),
            pid: std::process::id(),
            level,
        })
    }

    /// Installs `self` as the logger of the process.
    pub fn install(self) -> Result<(), log::SetLoggerError> {
        let level = self.level;
        log::set_boxed_logger(Box::new(self))?;
        log::set_max_level(level);
        Ok(())
    }

    fn format(&self, level: log::Level, text: &str) -> String {
        let severity = match level {
            log::Level::Error => 3,
            log::Level::Warn => 4,
            log::Level::Info => 6,
            log::Level::Debug | log::Level::Trace => 7,
        };
        let mut msg = format!("<{}>{}[{}]: ", LOG_DAEMON | severity, self.ident, self.pid);
        let room = MAX_MESSAGE.saturating_sub(msg.len());
        let mut cut = text.len().min(room);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.push_str(&text[..cut]);
        msg
    }
}

impl log::Log for Syslog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let msg = self.format(record.level(), &record.args().to_string());
        // A lost log line must not stop the daemon: the result is ignored.
        // SAFETY: write(2) reads `msg.len()` bytes of `msg`, valid for the call.
        unsafe { libc::write(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log;

    #[test]
    fn test_messages_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let server = UnixDatagram::bind(&path).unwrap();
        let logger = Syslog::connect(&path, "virtio-9p-server", log::LevelFilter::Info).unwrap();
        let pid = std::process::id();
        logger.log(
            &log::Record::builder()
                .level(log::Level::Warn)
                .args(format_args!("hello {}", 1))
                .build(),
        );
        logger.log(
            &log::Record::builder()
                .level(log::Level::Debug)
                .args(format_args!("filtered"))
                .build(),
        );
        logger.log(
            &log::Record::builder()
                .level(log::Level::Error)
                .args(format_args!("{}", "é".repeat(5000)))
                .build(),
        );
        let mut buf = vec![0; 65536];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            format!("<28>virtio-9p-server[{pid}]: hello 1")
        );
        let n = server.recv(&mut buf).unwrap();
        let long = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(long.starts_with("<27>virtio-9p-server["), "{}", &long[..40]);
        assert!(n <= MAX_MESSAGE && n > MAX_MESSAGE - 4, "{n}");
    }

    #[test]
    fn test_missing_socket_is_an_error() {
        let e = Syslog::connect(
            Path::new("/nonexistent/dev/log"),
            "x",
            log::LevelFilter::Info,
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
