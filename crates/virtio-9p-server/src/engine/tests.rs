// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
use super::coroutine::{flush, offload};
use super::*;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::StackPool;

use super::EngineError;
use crate::exec::{Blocking, CallHint, Cancel};
use crate::protocol::MsgType;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

fn config(workers: usize) -> EngineConfig {
    EngineConfig {
        workers,
        ..EngineConfig::default()
    }
}

fn engine_with(config: &EngineConfig) -> Engine {
    let pool = Arc::new(
        StackPool::new(coro_pool::PoolConfig::default().stack_size(DEFAULT_STACK_SIZE)).unwrap(),
    );
    Engine::new(pool, config).unwrap()
}

fn engine(workers: usize) -> Engine {
    engine_with(&config(workers))
}

/// Polls until `n` completions arrived (or 10 s).
fn drive(e: &mut Engine, n: usize) -> Vec<(u16, u32)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n && Instant::now() < deadline {
        e.poll();
        e.take_completed(&mut out);
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

/// The length a task reports for a call result: the value, or 0 for
/// EINTR (cancelled), 1000 + errno for other errors.
fn len_of(r: io::Result<u32>) -> u32 {
    match r {
        Ok(v) => v,
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => 0,
        Err(e) => 1000 + e.raw_os_error().unwrap_or(0) as u32,
    }
}

/// Starts a Tflush of `oldtag` (its task returns 7) and returns what
/// completed by the time it yielded or finished.
fn flush_now(e: &mut Engine, token: u16, oldtag: u16) -> Vec<(u16, u32)> {
    e.spawn(token, None, Cancel::new(), move || {
        flush(oldtag);
        7
    })
    .unwrap();
    let mut out = Vec::new();
    e.take_completed(&mut out);
    out
}

/// Counts drops: proves a cancelled request's locals are dropped.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn test_offload_runs_off_thread_and_returns() {
    let mut e = engine(2);
    let me = std::thread::current().id();
    e.spawn(1, Some(1), Cancel::new(), move || {
        len_of(offload(move || {
            Ok(u32::from(std::thread::current().id() != me))
        }))
    })
    .unwrap();
    assert_eq!(e.in_flight(), 1);
    assert_eq!(drive(&mut e, 1), vec![(1, 1)]);
    assert_eq!(e.stats().offloaded, 1);
}

#[test]
fn test_inline_request_completes_without_a_hop() {
    let mut e = engine(1);
    e.spawn(3, None, Cancel::new(), || 7).unwrap();
    let mut out = Vec::new();
    e.take_completed(&mut out);
    assert_eq!(out, vec![(3, 7)]);
    assert_eq!(e.stats().offloaded, 0);
}

#[test]
fn test_1024_in_flight_on_two_workers() {
    let mut e = engine(2);
    let gate = Arc::new(std::sync::Barrier::new(3));
    let started = Arc::new(AtomicUsize::new(0));
    for i in 0..1024u16 {
        let gate = Arc::clone(&gate);
        let started = Arc::clone(&started);
        e.spawn(i, Some(i), Cancel::new(), move || {
            len_of(offload(move || {
                // The first two jobs hold both workers until the test
                // has seen all 1024 requests in flight.
                if started.fetch_add(1, Ordering::SeqCst) < 2 {
                    gate.wait();
                }
                Ok(1)
            }))
        })
        .unwrap();
    }
    assert_eq!(e.in_flight(), 1024);
    assert_eq!(e.stats().peak_in_flight, 1024);
    gate.wait();
    assert_eq!(drive(&mut e, 1024).len(), 1024);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn test_flush_resumes_a_queued_request_with_cancelled() {
    let mut e = engine(1);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = Arc::new(Mutex::new(rx));
    // Tag 1 occupies the only worker; tag 2 waits in the queue.
    let r = Arc::clone(&rx);
    e.spawn(10, Some(1), Cancel::new(), move || {
        len_of(offload(move || {
            r.lock().unwrap().recv().unwrap();
            Ok(11)
        }))
    })
    .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (ran2, dropped2) = (Arc::clone(&ran), Arc::clone(&dropped));
    e.spawn(20, Some(2), Cancel::new(), move || {
        let _local = Dropped(dropped2);
        len_of(offload(move || {
            ran2.fetch_add(1, Ordering::SeqCst);
            Ok(22)
        })) + 5
    })
    .unwrap();
    // Tflush of tag 2: the old request returns (EINTR) before Rflush.
    assert_eq!(flush_now(&mut e, 30, 2), vec![(20, 5), (30, 7)]);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a flushed queued call never runs"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "its locals were dropped");
    tx.send(()).unwrap();
    assert_eq!(drive(&mut e, 1), vec![(10, 11)]);
    let st = e.stats();
    assert_eq!((st.cancelled, st.cancel_resumes, st.unwound), (1, 1, 0));
}

#[test]
fn test_flush_waits_for_a_running_request() {
    let mut e = engine(1);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let cancel = Cancel::new();
    let seen = cancel.clone();
    e.spawn(1, Some(5), cancel, move || {
        len_of(offload(move || {
            started_tx.send(()).unwrap();
            rx.recv().unwrap();
            Ok(if seen.is_cancelled() { 0 } else { 99 })
        }))
    })
    .unwrap();
    started_rx.recv().unwrap();
    let out = flush_now(&mut e, 2, 5);
    assert!(out.is_empty(), "Rflush must wait for the running request");
    tx.send(()).unwrap();
    assert_eq!(drive(&mut e, 2), vec![(1, 0), (2, 7)]);
}

#[test]
fn test_flush_of_a_flush_waits_for_the_first_target() {
    let mut e = engine(1);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    e.spawn(1, Some(5), Cancel::new(), move || {
        len_of(offload(move || {
            started_tx.send(()).unwrap();
            rx.recv().unwrap();
            Ok(99)
        }))
    })
    .unwrap();
    started_rx.recv().unwrap();
    // Tflush (tag 6) of tag 5, then Tflush (tag 7) of tag 6.
    e.spawn(2, Some(6), Cancel::new(), || {
        flush(5);
        7
    })
    .unwrap();
    e.spawn(3, Some(7), Cancel::new(), || {
        flush(6);
        8
    })
    .unwrap();
    let mut out = Vec::new();
    e.take_completed(&mut out);
    assert!(
        out.is_empty(),
        "no Rflush before the running request: {out:?}"
    );
    tx.send(()).unwrap();
    assert_eq!(drive(&mut e, 3), vec![(1, 99), (2, 7), (3, 8)]);
    assert_eq!(e.stats().unwound, 0);
}

#[test]
fn test_flush_of_unknown_tag_answers_at_once() {
    let mut e = engine(1);
    assert_eq!(flush_now(&mut e, 1, 1234), vec![(1, 7)]);
}

#[test]
fn test_flush_of_a_sleeper_resumes_it() {
    let mut e = engine(1);
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = Arc::clone(&dropped);
    e.spawn(1, Some(9), Cancel::new(), move || {
        let _local = Dropped(d);
        sleep(Duration::from_secs(3600));
        // A cancelled request gets "cancelled" at every later yield.
        let again = offload(|| Ok(5));
        sleep(Duration::from_secs(3600));
        len_of(again) + 3
    })
    .unwrap();
    assert_eq!(flush_now(&mut e, 2, 9), vec![(1, 3), (2, 7)]);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(e.stats().offloaded, 0);
    assert_eq!(e.stats().unwound, 0);
}

#[test]
fn test_sleep_yields_to_the_timer() {
    let mut e = engine(1);
    let t0 = Instant::now();
    e.spawn(1, None, Cancel::new(), || {
        sleep(Duration::from_millis(30));
        5
    })
    .unwrap();
    e.spawn(2, None, Cancel::new(), || 6).unwrap();
    let mut out = Vec::new();
    e.take_completed(&mut out);
    assert_eq!(out, vec![(2, 6)], "the sleeper must not block the thread");
    assert_eq!(drive(&mut e, 1), vec![(1, 5)]);
    assert!(t0.elapsed() >= Duration::from_millis(30));
}

#[test]
fn test_panicking_call_returns_the_chain_empty() {
    let mut e = engine(1);
    e.spawn(1, None, Cancel::new(), || {
        len_of(offload(|| panic!("boom")));
        9
    })
    .unwrap();
    assert_eq!(drive(&mut e, 1), vec![(1, 0)]);
    // The engine keeps working.
    e.spawn(2, None, Cancel::new(), || len_of(offload(|| Ok(3))))
        .unwrap();
    assert_eq!(drive(&mut e, 1), vec![(2, 3)]);
}

#[test]
fn test_quiesce_resumes_waiting_requests_and_drops_their_locals() {
    let mut e = engine(1);
    let dropped = Arc::new(AtomicUsize::new(0));
    for i in 0..4u16 {
        let d = Arc::clone(&dropped);
        e.spawn(i, Some(i), Cancel::new(), move || {
            let _local = Dropped(d);
            sleep(Duration::from_secs(3600));
            1
        })
        .unwrap();
    }
    assert_eq!(e.quiesce(Duration::from_secs(1)), 0);
    let mut out = Vec::new();
    e.take_completed(&mut out);
    assert_eq!(out.len(), 4);
    assert_eq!(dropped.load(Ordering::SeqCst), 4);
    let st = e.stats();
    assert_eq!((st.cancelled, st.unwound), (4, 0));
}

#[test]
fn test_drain_ends_waits_and_waits_for_running_calls() {
    let mut e = engine(1);
    // A waiter that would sleep for an hour at a time until its waits
    // are ended.
    let waiter = Cancel::new();
    let token = waiter.clone();
    e.spawn(1, Some(1), waiter, move || loop {
        if token.waits_ended() {
            return 7;
        }
        sleep(Duration::from_secs(3600));
    })
    .unwrap();
    // A call running on the worker for a while.
    e.spawn(2, Some(2), Cancel::new(), || {
        let r: io::Result<u32> = offload(|| {
            std::thread::sleep(Duration::from_millis(200));
            Ok(9)
        });
        r.unwrap_or(0)
    })
    .unwrap();
    assert_eq!(e.in_flight(), 2);
    assert_eq!(e.drain(|| false), 0);
    let mut out = Vec::new();
    e.take_completed(&mut out);
    out.sort_unstable();
    assert_eq!(out, vec![(1, 7), (2, 9)]);
    let st = e.stats();
    assert_eq!((st.cancelled, st.completed, st.leaked), (0, 2, 0));
}

#[test]
fn test_pause_keeps_waiters_held_until_resumed_or_discarded() {
    let mut e = engine(1);
    // A lock-like waiter: it tries only when its waits are not held,
    // counting its attempts, and succeeds once `free` is set.
    let free = Arc::new(AtomicUsize::new(0));
    let tries = Arc::new(AtomicUsize::new(0));
    let waiter = Cancel::new();
    let (token, f, t) = (waiter.clone(), Arc::clone(&free), Arc::clone(&tries));
    e.spawn(1, Some(1), waiter, move || loop {
        if token.is_cancelled() {
            return 0;
        }
        if !token.waits_held() {
            t.fetch_add(1, Ordering::SeqCst);
            if f.load(Ordering::SeqCst) == 1 {
                return 7;
            }
        }
        sleep(Duration::from_millis(5));
    })
    .unwrap();
    // A call running on the worker finishes before the pause returns.
    e.spawn(2, Some(2), Cancel::new(), || {
        let r: io::Result<u32> = offload(|| {
            std::thread::sleep(Duration::from_millis(100));
            Ok(9)
        });
        r.unwrap_or(0)
    })
    .unwrap();
    assert_eq!(e.pause(|| false), 1, "the waiter is kept");
    let mut out = Vec::new();
    e.take_completed(&mut out);
    assert_eq!(out, vec![(2, 9)]);
    // Held: no attempt, even when the lock is free, however long.
    free.store(1, Ordering::SeqCst);
    let before = tries.load(Ordering::SeqCst);
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
        e.poll();
    }
    assert_eq!(tries.load(Ordering::SeqCst), before, "a held waiter tried");
    e.take_completed(&mut out);
    assert_eq!(out, vec![(2, 9)], "a held waiter finished");
    // Resumed: it tries at once and finishes.
    e.resume_waits();
    e.take_completed(&mut out);
    assert_eq!(out, vec![(2, 9), (1, 7)]);

    // Paused again, then discarded: abandoned before it is cancelled.
    let waiter = Cancel::new();
    let token = waiter.clone();
    let seen = waiter.clone();
    e.spawn(3, Some(3), waiter, move || loop {
        if token.is_cancelled() {
            return if token.is_gone() { 0 } else { 99 };
        }
        sleep(Duration::from_millis(5));
    })
    .unwrap();
    assert_eq!(e.pause(|| false), 1);
    assert_eq!(e.discard(), 0);
    assert!(seen.is_gone() && seen.is_abandoned());
    out.clear();
    e.take_completed(&mut out);
    assert_eq!(out, vec![(3, 0)]);
}

#[test]
fn test_drain_gives_up_when_told() {
    let (mut e, gate) = stuck_engine();
    assert_eq!(e.drain(|| true), 1);
    drop(gate);
}

#[test]
fn test_reset_abandons_the_requests_it_leaks() {
    let (mut e, gate) = stuck_engine();
    let token = e
        .slots
        .iter()
        .flatten()
        .map(|s| s.cancel.clone())
        .next()
        .unwrap();
    assert!(!token.is_abandoned());
    assert_eq!(e.reset(), 1);
    assert!(token.is_abandoned());
    assert_eq!(token.guest_access(|| ()), None);
    drop(gate);
}

#[test]
fn test_offload_outside_a_coroutine_runs_inline() {
    assert!(!on_coroutine());
    assert_eq!(offload(|| Ok::<_, u32>(5)), Ok(5));
    assert_eq!(
        EngineExec::new(OffloadPolicy::Always)
            .run(MsgType::Tread, || Ok::<_, u32>(6))
            .unwrap(),
        6
    );
    assert_eq!(
        EngineExec::new(OffloadPolicy::Auto).read_at(|| false, || Ok::<_, u32>(7)),
        Ok(7)
    );
}

#[test]
fn test_auto_runs_short_metadata_calls_inline_only_for_a_local_filesystem() {
    // (op, the filesystem's hint, whether the call must hop).
    let cases = [
        (MsgType::Tgetattr, CallHint::LocalMetadata, false),
        (MsgType::Twalk, CallHint::LocalMetadata, false),
        (MsgType::Tclunk, CallHint::LocalMetadata, false),
        (MsgType::Tstatfs, CallHint::LocalMetadata, false),
        (MsgType::Treadlink, CallHint::LocalMetadata, false),
        (MsgType::Txattrwalk, CallHint::LocalMetadata, false),
        (MsgType::Tgetattr, CallHint::MayBlock, true),
        (MsgType::Twalk, CallHint::MayBlock, true),
        (MsgType::Tclunk, CallHint::MayBlock, true),
        (MsgType::Tsetattr, CallHint::LocalMetadata, true),
        (MsgType::Treaddir, CallHint::LocalMetadata, true),
        (MsgType::Tfsync, CallHint::LocalMetadata, true),
        (MsgType::Tlcreate, CallHint::LocalMetadata, true),
        (MsgType::Tlock, CallHint::LocalMetadata, true),
    ];
    let mut e = engine(2);
    let me = std::thread::current().id();
    for (i, (op, hint, hops)) in cases.into_iter().enumerate() {
        let before = e.stats().offloaded;
        let token = i as u16;
        e.spawn(token, Some(token), Cancel::new(), move || {
            let exec = EngineExec::new(OffloadPolicy::Auto);
            len_of(exec.run_hinted(op, hint, move || {
                Ok(u32::from(std::thread::current().id() != me))
            }))
        })
        .unwrap();
        assert_eq!(drive(&mut e, 1), vec![(token, u32::from(hops))], "{op:?}");
        assert_eq!(e.stats().offloaded - before, u64::from(hops), "{op:?}");
    }
    // Always and Never ignore the hint.
    for (policy, hops) in [(OffloadPolicy::Always, 1), (OffloadPolicy::Never, 0)] {
        let before = e.stats().offloaded;
        e.spawn(99, None, Cancel::new(), move || {
            let exec = EngineExec::new(policy);
            len_of(
                exec.run_hinted(MsgType::Tgetattr, CallHint::LocalMetadata, move || {
                    Ok(u32::from(std::thread::current().id() != me))
                }),
            )
        })
        .unwrap();
        assert_eq!(drive(&mut e, 1), vec![(99, hops)], "{policy:?}");
        assert_eq!(e.stats().offloaded - before, u64::from(hops));
    }
}

#[test]
fn test_too_many_requests_is_an_error() {
    let cfg = EngineConfig {
        workers: 1,
        max_in_flight: 1,
        ..EngineConfig::default()
    };
    let mut e = engine_with(&cfg);
    e.spawn(1, None, Cancel::new(), || {
        sleep(Duration::from_secs(3600));
        1
    })
    .unwrap();
    assert!(matches!(
        e.spawn(2, None, Cancel::new(), || 1),
        Err(EngineError::TooManyRequests(1))
    ));
}

#[test]
fn test_zero_workers_run_every_call_inline() {
    let mut e = engine(0);
    let me = std::thread::current().id();
    e.spawn(1, None, Cancel::new(), move || {
        len_of(offload(move || {
            Ok(u32::from(std::thread::current().id() == me))
        }))
    })
    .unwrap();
    let mut out = Vec::new();
    e.take_completed(&mut out);
    assert_eq!(out, vec![(1, 1)], "done without a poll, on this thread");
    assert_eq!((e.stats().offloaded, e.stats().inline_calls), (0, 1));
}

/// An executor that runs every job on a fresh thread, or drops it.
struct Spawner {
    ran: AtomicUsize,
    drop_jobs: bool,
}

impl Executor for Spawner {
    fn execute(&self, job: Job) {
        self.ran.fetch_add(1, Ordering::SeqCst);
        if self.drop_jobs {
            drop(job);
        } else {
            std::thread::spawn(move || job.run());
        }
    }
}

#[test]
fn test_embedder_executor_runs_the_jobs() {
    let exec = Arc::new(Spawner {
        ran: AtomicUsize::new(0),
        drop_jobs: false,
    });
    let mut e = engine_with(&EngineConfig {
        workers: 0,
        executor: Some(exec.clone()),
        ..EngineConfig::default()
    });
    let me = std::thread::current().id();
    for i in 0..8 {
        e.spawn(i, Some(i), Cancel::new(), move || {
            len_of(offload(move || {
                Ok(u32::from(std::thread::current().id() != me))
            }))
        })
        .unwrap();
    }
    let out = drive(&mut e, 8);
    assert_eq!(out.len(), 8);
    assert!(out.iter().all(|(_, len)| *len == 1));
    assert_eq!(exec.ran.load(Ordering::SeqCst), 8);
}

#[test]
fn test_dropped_job_finishes_its_request_as_cancelled() {
    let exec = Arc::new(Spawner {
        ran: AtomicUsize::new(0),
        drop_jobs: true,
    });
    let mut e = engine_with(&EngineConfig {
        executor: Some(exec),
        ..EngineConfig::default()
    });
    e.spawn(1, None, Cancel::new(), || len_of(offload(|| Ok(5))) + 1)
        .unwrap();
    assert_eq!(drive(&mut e, 1), vec![(1, 1)]);
    assert_eq!(e.stats().unwound, 0);
}

#[test]
fn test_start_hook_runs_on_every_worker() {
    let started = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&started);
    let e = engine_with(&EngineConfig {
        workers: 3,
        on_worker_start: Some(Arc::new(move || {
            s.fetch_add(1, Ordering::SeqCst);
        })),
        ..EngineConfig::default()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::SeqCst) < 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Two pools of three.
    assert_eq!(started.load(Ordering::SeqCst), 6);
    drop(e);
}

/// Spawns a request whose call blocks until `gate`'s sender is
/// dropped (never, in the tests that leak it), and returns once a
/// worker runs it.
fn spawn_stuck(e: &mut Engine, token: u16, gate: &Arc<Mutex<std::sync::mpsc::Receiver<()>>>) {
    let g = Arc::clone(gate);
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    e.spawn(token, Some(token), Cancel::new(), move || {
        len_of(offload(move || {
            let _ = started_tx.send(());
            let _ = g.lock().unwrap().recv();
            Ok(1)
        }))
    })
    .unwrap();
    started_rx.recv().unwrap();
}

/// How long the teardown tests let a reset wait.
const STUCK_TIMEOUT: Duration = Duration::from_millis(300);

/// An engine with one worker whose request 1 is stuck in a call until
/// the returned sender is dropped.
fn stuck_engine() -> (Engine, std::sync::mpsc::Sender<()>) {
    let mut e = engine_with(&EngineConfig {
        workers: 1,
        quiesce_timeout: STUCK_TIMEOUT,
        ..EngineConfig::default()
    });
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    spawn_stuck(&mut e, 1, &Arc::new(Mutex::new(rx)));
    (e, tx)
}

#[test]
fn test_reset_leaks_a_stuck_call_within_the_bound() {
    let timeout = STUCK_TIMEOUT;
    let (mut e, tx) = stuck_engine();
    // A sleeper and a queued call behind the stuck one are cancelled.
    e.spawn(2, Some(2), Cancel::new(), || {
        sleep(Duration::from_secs(3600));
        2
    })
    .unwrap();
    e.spawn(3, Some(3), Cancel::new(), || len_of(offload(|| Ok(3))) + 30)
        .unwrap();
    let t0 = Instant::now();
    assert_eq!(e.reset(), 1);
    let took = t0.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(3),
        "{took:?}"
    );
    let mut out = Vec::new();
    e.take_completed(&mut out);
    out.sort_unstable();
    assert_eq!(out, vec![(1, 0), (2, 2), (3, 30)]);
    assert_eq!(e.in_flight(), 0);
    assert_eq!((e.stats().leaked, e.stats().unwound), (1, 0));
    // The late completion of the leaked call is ignored, and the engine
    // keeps serving (on the other pool: the general one is stuck).
    drop(tx);
    e.spawn(4, None, Cancel::new(), || {
        sleep(Duration::from_millis(1));
        4
    })
    .unwrap();
    let out = drive(&mut e, 1);
    assert_eq!(out, vec![(4, 4)]);
}

#[test]
fn test_drop_with_a_call_that_never_returns_is_bounded() {
    let timeout = STUCK_TIMEOUT;
    let (mut e, tx) = stuck_engine();
    // Never answered: the sender lives past the test (leaked).
    std::mem::forget(tx);
    let t0 = Instant::now();
    let stats = e.shutdown();
    drop(e);
    let took = t0.elapsed();
    assert_eq!(stats.leaked, 1);
    assert!(
        took < timeout + WORKER_JOIN_TIMEOUT + Duration::from_secs(2),
        "{took:?}"
    );
}
