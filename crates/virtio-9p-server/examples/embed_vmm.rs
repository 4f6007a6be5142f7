// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Embedding the virtio-9p device in a VMM with [`Device`] (README,
//! "Embedding in a VMM"), under both ring layouts. The VMM acks the
//! driver's features, activates the device with guest memory, the queue
//! and an interrupt callback, and calls `process_queue` on each kick (an
//! epoll thread also polls `Device::fds`, or hands a thread to
//! `Device::run`). The guest is virtqueue-large's driver mock on the same
//! memory, under the crate's 9P client, reading a host file.
//!
//! `cargo run -p virtio-9p-server --features test-utils --example embed_vmm`
//! prints `embed_vmm: ok: ...` (CI: `ci/embed-vmm.sh`).

use std::io::{Error, Result};
use virtio_9p_server::client::{Client, Transport};
use virtio_9p_server::virtio::{Device, DEVICE_FEATURES};
use virtio_9p_server::{engine::EngineConfig, protocol::OpenFlags, *};
use virtqueue_large::mock::{guest_memory, Layout, MockDriver, MockPackedDriver, MockRing};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap as Mem};

/// The guest, a driver of either layout: each 9P call is a chain and a kick.
struct Guest<'m>(
    Device<PassthroughFs, Mem>,
    Box<dyn MockRing<Memory = Mem> + 'm>,
);

impl Transport for Guest<'_> {
    fn call(&mut self, frame: &[u8]) -> Result<Vec<u8>> {
        let Guest(dev, ring) = self;
        let chain = ring.add_chain_with_data(Layout::Direct, &[frame], &[8192]);
        let chain = chain.map_err(Error::other)?;
        loop {
            // The kick, then the engine's fds: blocking calls run on workers.
            dev.process_queue().map_err(Error::other)?;
            if let Some(used) = ring.take_used().first() {
                let reply = ring.read_writable(&chain).map_err(Error::other)?;
                return Ok(reply[..used.len as usize].to_vec());
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("hello"), "hello from the host")?;
    for packed in [false, true] {
        let mem = guest_memory(16 << 20);
        let ring: Box<dyn MockRing<Memory = Mem>> = match packed {
            true => Box::new(MockPackedDriver::new(&mem, 1024)),
            false => Box::new(MockDriver::new(&mem, 1024)),
        };
        // The VMM's side: the device, the driver's features, activation.
        let fs = PassthroughFs::new(PassthroughConfig::new(dir.path()))?;
        let server = std::sync::Arc::new(Server::new(fs, Config::default())?);
        let mut dev = Device::new(server, "share", &EngineConfig::default())?;
        dev.ack_features(DEVICE_FEATURES & !(u64::from(!packed) << 34))?; // RING_PACKED
        let irq = Box::new(|| { /* raise the queue's MSI-X vector */ });
        dev.activate(
            GuestMemoryAtomic::new(mem.clone()),
            ring.config_queue(),
            irq,
        )?;

        let mut guest = Client::new(Guest(dev, ring));
        guest.version(8192)?;
        guest.attach(0, 0)?;
        guest.walk(0, 1, &[b"hello"])?;
        guest.lopen(1, OpenFlags::RDONLY)?;
        assert_eq!(guest.read(1, 0, 64)?, b"hello from the host");
    }
    println!("embed_vmm: ok: one file read through the split and the packed ring");
    Ok(())
}
