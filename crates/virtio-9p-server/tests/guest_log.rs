// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A guest that floods the server with bad requests gets each one answered,
//! but the host log sees a bounded number of lines: the server's limit on
//! guest-triggered lines holds the rest back and reports them as one
//! "suppressed K" line, so that no line is lost uncounted.

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Instant;

use log::{Level, LevelFilter, Log, Metadata, Record};
use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::protocol::{Header, Rmessage, HEADER_SIZE};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

/// Every line at warn or above, with the thread that logged it.
struct Capture(Mutex<Vec<(ThreadId, String)>>);

impl Log for Capture {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= Level::Warn
    }
    fn log(&self, r: &Record<'_>) {
        if self.enabled(r.metadata()) {
            let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
            lines.push((std::thread::current().id(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

/// A frame of an unknown message type: decodes to "malformed request".
fn bad_frame(tag: u16) -> Vec<u8> {
    let mut f = Header {
        size: HEADER_SIZE as u32 + 3,
        ty: 0xee,
        tag,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(&[1, 2, 3]);
    f
}

#[test]
fn test_flood_of_bad_requests_yields_bounded_log_lines() {
    log::set_logger(&CAPTURE).unwrap();
    log::set_max_level(LevelFilter::Warn);
    const FLOOD: usize = 5000;
    let per_sec = 10;
    let dir = tempfile::tempdir().unwrap();
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
    let mut config = Config::default();
    config.guest_log_lines_per_sec = per_sec;
    let server = Arc::new(Server::new(fs, config).unwrap());
    let mut c = Client::new(InProcess::new(server, 8192));
    let start = Instant::now();
    // Half before Tversion, half malformed after it.
    for i in 0..FLOOD {
        if i == FLOOD / 2 {
            c.version(8192).unwrap();
        }
        let (tag, reply) = c.raw(&bad_frame(i as u16)).unwrap();
        assert_eq!(tag, i as u16);
        assert!(matches!(reply, Rmessage::Lerror(_)), "{reply:?}");
    }
    // Still serving.
    c.attach(0, 0).unwrap();
    c.getattr(0).unwrap();
    let windows = start.elapsed().as_secs() as usize + 1;
    // Dropping the server reports what the last window held back.
    drop(c);

    let me = std::thread::current().id();
    let lines: Vec<String> = CAPTURE
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| *t == me)
        .map(|(_, l)| l.clone())
        .collect();
    let (reports, logged): (Vec<&String>, Vec<&String>) =
        lines.iter().partition(|l| l.starts_with("9p: suppressed "));
    let suppressed: usize = reports
        .iter()
        .map(|l| {
            l.trim_start_matches("9p: suppressed ")
                .trim_end_matches(" guest-triggered log lines")
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert!(
        logged.len() <= per_sec as usize * windows,
        "{} lines in {windows} s: {logged:?}",
        logged.len()
    );
    assert!(reports.len() <= windows, "{reports:?}");
    assert!(!logged.is_empty() && !reports.is_empty());
    assert!(logged.iter().any(|l| l.contains("before Tversion")));
    assert!(logged.iter().all(|l| l.starts_with("9p: ")), "{logged:?}");
    // Every bad request is either logged or counted.
    assert_eq!(logged.len() + suppressed, FLOOD, "{lines:?}");
}
