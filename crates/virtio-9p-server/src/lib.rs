//! A 9P2000.L file server for VMMs: a library a VMM embeds, a vhost-user
//! daemon and a plain socket server.
//!
//! It composes the other crates of this workspace: requests arrive as
//! descriptor chains validated by `virtqueue-large`, each runs on a
//! `coro-pool` coroutine, and the daemon locks its memory as `mlock-policy`
//! says.
//!
//! # Status
//!
//! This release contains the crate skeleton only. The planned API:
//!
//! - `protocol`: strict encode/decode of every 9P2000.L message.
//! - `Server` over a `Filesystem` trait, with per-session fids and msize.
//! - `PassthroughFs`: an escape-proof passthrough export on `O_PATH` fds.
//! - A virtio device and a vhost-user backend with a coroutine request engine,
//!   msize up to 128 MiB and 1024 requests in flight.
//! - The `virtio-9p-server` binary: vhost-user daemon or `--listen` socket server.
