// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Profiling aid for the virtio-9p suite's 128 MiB Tread: the
//! same daemon, fake VMM and request layout as `vhost.rs`'s sequential
//! read, in a loop for `perf record`. Usage:
//! `cargo run --release -p vmm-benches --example read_128m_profile -- [MSIZE_MIB] [SECONDS] [adjacent|scattered]`
//!
//! `scattered` lays the data out as the suite's "Tread, scattered pages":
//! the request, an 11-byte header buffer, then 4 KiB pages in a fixed
//! random order, from an indirect table written once.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use virtio_9p_server::protocol::{OpenFlags, Tmessage, Tread, IOHDRSZ};
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const REQ_AREA: u64 = 0x30_0000;
const TABLE_AREA: u64 = 0x40_0000;
const DATA_AREA: u64 = 0x100_0000;
const HDR_AREA: u64 = 0x38_0000;
/// Split-ring descriptor flags.
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let msize_mib: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(128);
    let secs: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
    let scattered = match args.get(3).map(String::as_str) {
        None | Some("adjacent") => false,
        Some("scattered") => true,
        Some(other) => return Err(format!("layout {other}: adjacent or scattered").into()),
    };
    let msize = msize_mib << 20;
    let file_len: u64 = 1 << 30;
    let dir = tempfile::tempdir()?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.path().join("big"))?;
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
        for _ in 0..file_len >> 20 {
            f.write_all(&block)?;
        }
    }
    let sock_dir = tempfile::tempdir()?;
    let socket = sock_dir.path().join("vu.sock");
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path()))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(socket.clone());
    config.backend.tag = "bench".into();
    config.backend.engine.workers = 4;
    config.backend.engine.max_in_flight = 1024;
    let mut daemon = Daemon::new(server, config)?;
    let _stop = daemon.stop_handle();
    std::thread::spawn(move || {
        if let Err(e) = daemon.run() {
            eprintln!("daemon failed: {e}");
        }
    });
    let mut vmm = FakeVmm::connect(&socket, {
        let mut o = VmmOptions::default();
        o.mem_size = 160 << 20;
        o
    })?;
    vmm.open_file(Some(msize), "big", OpenFlags::RDONLY)?;
    let chunk = msize - IOHDRSZ;
    let mem = vmm.memory().clone();
    let req_len = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: chunk,
    })
    .encode_frame(7)
    .len() as u32;
    let n_desc = 2 + chunk.div_ceil(4096);
    if scattered {
        // The same pages as the suite's scattered layout (same seed).
        let mut pages: Vec<u64> = (0..u64::from(n_desc - 2))
            .map(|i| DATA_AREA + i * 4096)
            .collect();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..pages.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            pages.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        vmm.write_table_desc(TABLE_AREA, 0, REQ_AREA, req_len, F_NEXT, 1)?;
        vmm.write_table_desc(TABLE_AREA, 1, HDR_AREA, 11, F_WRITE | F_NEXT, 2)?;
        let mut left = chunk;
        for (i, &page) in pages.iter().enumerate() {
            let len = left.min(4096);
            left -= len;
            let idx = 2 + i as u32;
            let (flags, next) = if idx + 1 < n_desc {
                (F_WRITE | F_NEXT, (idx + 1) as u16)
            } else {
                (F_WRITE, 0)
            };
            vmm.write_table_desc(TABLE_AREA, idx, page, len, flags, next)?;
        }
    }
    let mut offset = 0u64;
    let (mut submit_s, mut wait_s, mut bytes) = (0.0, 0.0, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        let req = Tmessage::Read(Tread {
            fid: 1,
            offset,
            count: chunk,
        })
        .encode_frame(7);
        mem.write_slice(&req, GuestAddress(REQ_AREA))?;
        if scattered {
            let head = vmm.take_desc()?;
            vmm.write_desc(head, TABLE_AREA, 16 * n_desc, F_INDIRECT, 0)?;
            vmm.push_avail(head)?;
        } else {
            vmm.submit_at(
                REQ_AREA,
                req_len,
                DATA_AREA,
                chunk + 11,
                Layout::Indirect { seg: 4096 },
                TABLE_AREA,
            )?;
        }
        vmm.kick()?;
        let t1 = Instant::now();
        let used = vmm.wait_used(Duration::from_secs(30))?;
        let t2 = Instant::now();
        submit_s += (t1 - t).as_secs_f64();
        wait_s += (t2 - t1).as_secs_f64();
        if used.len() != 1 || used[0].len != chunk + 11 {
            return Err(format!("bad completion {used:?}").into());
        }
        bytes += u64::from(chunk);
        offset += u64::from(chunk);
        if offset + u64::from(chunk) > file_len {
            offset = 0;
        }
    }
    let total = t0.elapsed().as_secs_f64();
    println!(
        "msize {msize_mib} MiB, {} pages: {:.2} GiB/s; submit {:.1}% of the time, wait {:.1}%",
        if scattered { "scattered" } else { "adjacent" },
        bytes as f64 / total / f64::from(1u32 << 30),
        100.0 * submit_s / total,
        100.0 * wait_s / total
    );
    Ok(())
}
