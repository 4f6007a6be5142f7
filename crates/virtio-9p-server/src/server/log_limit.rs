// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A per-server limit on guest-triggered log lines.
//!
//! A guest (or socket peer) that sends malformed requests in a loop must
//! not flood the host log. Every log line a guest can trigger (in the
//! server, the virtio queue and the socket transport) first asks the
//! server's [`LogLimit`]: at most `lines_per_sec` lines pass in each
//! one-second window; the rest are counted, and the first line of the next
//! window (or dropping the server) is preceded by one
//! `suppressed K guest-triggered log lines` line. The limiter belongs to
//! one [`Server`](crate::Server), so one guest's flood does not silence
//! another device's log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::warn;

/// Default for [`Config::guest_log_lines_per_sec`](crate::Config).
pub(crate) const DEFAULT_GUEST_LOG_LINES_PER_SEC: u32 = 10;

const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    /// Start of the current window (`None` before the first line).
    start: Option<Instant>,
    /// Lines let through in the current window.
    lines: u32,
    /// Lines held back since the last report.
    suppressed: u64,
}

/// Lets at most `lines_per_sec` guest-triggered lines through per second.
#[derive(Debug)]
pub(crate) struct LogLimit {
    lines_per_sec: u32,
    state: Mutex<State>,
}

impl LogLimit {
    pub(crate) fn new(lines_per_sec: u32) -> Self {
        LogLimit {
            lines_per_sec,
            state: Mutex::new(State::default()),
        }
    }

    /// Whether one more guest-triggered line may be logged now.
    pub(crate) fn admit(&self) -> bool {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.start
            .is_none_or(|t| now.saturating_duration_since(t) >= WINDOW)
        {
            report(&mut s);
            s.start = Some(now);
            s.lines = 0;
        }
        if s.lines < self.lines_per_sec {
            s.lines += 1;
            true
        } else {
            s.suppressed += 1;
            false
        }
    }
}

fn report(s: &mut State) {
    // Take the count first: `warn!` evaluates its arguments only when the
    // level is enabled.
    let n = std::mem::take(&mut s.suppressed);
    if n > 0 {
        warn!("9p: suppressed {n} guest-triggered log lines");
    }
}

impl Drop for LogLimit {
    fn drop(&mut self) {
        report(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_log_limit_windows_and_counts() {
        let l = LogLimit::new(3);
        let t0 = Instant::now();
        let admitted = (0..100).filter(|_| l.admit_at(t0)).count();
        assert_eq!(admitted, 3);
        assert_eq!(l.state.lock().unwrap().suppressed, 97);
        // Within the window: still closed.
        assert!(!l.admit_at(t0 + Duration::from_millis(999)));
        // The next window reports (and resets) the count, then opens.
        assert!(l.admit_at(t0 + WINDOW));
        assert_eq!(l.state.lock().unwrap().suppressed, 0);
        // Zero lines per second: nothing passes, everything is counted.
        let z = LogLimit::new(0);
        assert!(!z.admit_at(t0));
        assert_eq!(z.state.lock().unwrap().suppressed, 1);
    }
}
