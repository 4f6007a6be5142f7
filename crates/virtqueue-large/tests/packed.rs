// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Packed rings: valid chains, wrap counters, ids reused out of order,
//! used write-back in any order, event suppression, the vhost-user ring
//! base, and every malicious pattern refused with the queue still serving
//! where the specification allows.

use std::io::{Read, Write};

use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{
    avail_bits, guest_memory, pdesc, Buf, Layout, MockDriver, MockPackedDriver, PackedMalicious,
    UsedEntry, F_NEXT,
};
use virtqueue_large::packed::{EventMode, EventSuppression, EVENT_FLAG_DISABLE, EVENT_FLAG_ENABLE};
use virtqueue_large::{
    AnyRing, ChainLimits, ChainWalker, DeviceRing, Error, ErrorKind, PackedQueue,
    LARGE_MAX_DESCRIPTORS,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

type Driver<'a> = MockPackedDriver<'a, GuestMemoryMmap>;

fn large() -> ChainWalker {
    ChainWalker::new(ChainLimits::large()).unwrap()
}

/// Publishes a request, pops it, checks the payload, writes a reply, returns it.
fn round_trip(
    walker: &mut ChainWalker,
    driver: &mut Driver<'_>,
    queue: &mut PackedQueue,
    mem: &GuestMemoryMmap,
    layout: Layout,
) -> u16 {
    let laid = driver
        .add_chain_with_data(layout, &[b"hello ", b"packed"], &[4, 8])
        .unwrap();
    let chain = queue.pop_chain(walker, mem).unwrap().expect("a chain");
    assert_eq!(chain.head_index(), laid.head);
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, b"hello packed");
    let mut w = chain.writer();
    w.write_all(b"pong!").unwrap();
    queue
        .add_used(mem, chain.head_index(), w.bytes_written() as u32)
        .unwrap();
    assert_eq!(
        driver.take_used(),
        vec![UsedEntry {
            id: u32::from(laid.head),
            len: 5
        }]
    );
    assert_eq!(&driver.read_writable(&laid).unwrap()[..5], b"pong!");
    laid.head
}

#[test]
fn test_direct_and_indirect_chains_round_trip() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    let mut walker = large();
    for layout in [Layout::Direct, Layout::Indirect] {
        round_trip(&mut walker, &mut driver, &mut queue, &mem, layout);
    }
    assert!(queue.pop_chain(&mut walker, &mem).unwrap().is_none());
    assert_eq!(queue.in_flight(), 0);
}

#[test]
fn test_many_laps_on_a_ring_that_is_not_a_power_of_two() {
    // 4-descriptor chains on a 5-entry ring straddle its end in most laps.
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 5);
    let mut queue = driver.create_queue();
    let mut walker = large();
    for i in 0..40 {
        let layout = if i % 3 == 0 {
            Layout::Indirect
        } else {
            Layout::Direct
        };
        round_trip(&mut walker, &mut driver, &mut queue, &mem, layout);
    }
    let (pos, _) = queue.next_avail();
    assert_eq!(queue.next_used().0, pos);
    assert_eq!(driver.free_slots(), 5);
}

#[test]
fn test_used_out_of_order_and_ids_reused_out_of_order() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    let mut walker = large();
    for round in 0..6u16 {
        // Three chains of 1, 2 and 3 slots with ids the driver picks.
        let ids = [(round * 3) % 8, (round * 3 + 5) % 8, (round * 3 + 2) % 8];
        let mut chains = Vec::new();
        for (n, id) in ids.iter().enumerate() {
            let bufs = vec![Buf::w(16); n + 1];
            driver
                .add_chain_with_id(Layout::Direct, &bufs, *id)
                .unwrap();
        }
        for _ in 0..3 {
            chains.push(queue.pop_chain(&mut walker, &mem).unwrap().unwrap());
        }
        let got: Vec<u16> = chains.iter().map(|c| c.head_index()).collect();
        assert_eq!(got, ids);
        assert_eq!(queue.in_flight(), 3);
        // Return them last first: the driver advances by each id's slots.
        for (k, c) in chains.iter().enumerate().rev() {
            queue.add_used(&mem, c.head_index(), k as u32).unwrap();
        }
        let used = driver.take_used();
        assert_eq!(
            used,
            vec![
                UsedEntry {
                    id: u32::from(ids[2]),
                    len: 2
                },
                UsedEntry {
                    id: u32::from(ids[1]),
                    len: 1
                },
                UsedEntry {
                    id: u32::from(ids[0]),
                    len: 0
                },
            ]
        );
        assert_eq!(driver.free_slots(), 8);
    }
    assert_eq!(queue.next_used(), queue.next_avail());
}

#[test]
fn test_32768_descriptor_chains_direct_and_indirect() {
    let n = LARGE_MAX_DESCRIPTORS as usize;
    let mem = guest_memory(4 << 20);
    let bufs = vec![Buf::w(64); n];

    // Direct: a 32768-entry ring, the whole ring one chain.
    let mut driver = MockPackedDriver::new(&mem, 32768);
    let mut queue = driver.create_queue();
    let mut walker = large();
    driver.add_chain(Layout::Direct, &bufs).unwrap();
    let chain = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
    assert_eq!(chain.descriptor_count(), 32768);
    assert_eq!(chain.writable_len(), 64 * 32768);
    assert_eq!(queue.next_avail(), (0, false));

    // Indirect on a 256-entry ring: large accepts, strict refuses.
    for (limits, ok) in [(ChainLimits::large(), true), (ChainLimits::strict(), false)] {
        let mut driver = MockPackedDriver::new(&mem, 256);
        let mut queue = driver.create_queue();
        let mut walker = ChainWalker::new(limits).unwrap();
        driver.add_chain(Layout::Indirect, &bufs).unwrap();
        match queue.pop_chain(&mut walker, &mem) {
            Ok(Some(chain)) => {
                assert!(ok);
                assert_eq!(chain.descriptor_count(), 32768);
            }
            Err(Error::TooManyDescriptors { max: 256 }) => assert!(!ok),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn test_head_with_the_wrong_wrap_counter_is_not_available() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    let mut walker = large();
    // Flags of the previous lap (AVAIL = 0, USED = 1 with wrap 1) at the head.
    driver
        .write_slot(0, pdesc(0x10000, 8, 0, avail_bits(false)))
        .unwrap();
    assert!(queue.pop_chain(&mut walker, &mem).unwrap().is_none());
    // Both bits equal to the wrap counter: a used descriptor, not available.
    driver
        .write_slot(
            0,
            pdesc(0x10000, 8, 0, avail_bits(true) | avail_bits(false)),
        )
        .unwrap();
    assert!(queue.pop_chain(&mut walker, &mem).unwrap().is_none());
    assert_eq!(queue.next_avail(), (0, true));
    // The driver then publishes properly and the queue serves it.
    round_trip(&mut walker, &mut driver, &mut queue, &mem, Layout::Direct);
}

#[test]
fn test_every_packed_malicious_pattern() {
    assert!(PackedMalicious::ALL.len() >= 20);
    let mem = guest_memory(PackedMalicious::MIN_MEMORY);
    for &pattern in PackedMalicious::ALL {
        let mut driver = MockPackedDriver::new(&mem, 16);
        let mut queue = driver.create_queue();
        queue.set_event_idx(pattern.needs_event_idx());
        let mut walker = ChainWalker::new(pattern.limits()).unwrap();
        // Move off slot 0 first, so that patterns meet a later lap too.
        round_trip(&mut walker, &mut driver, &mut queue, &mem, Layout::Direct);
        driver.add_malicious(pattern).unwrap();
        if pattern.is_event() {
            let err = queue.needs_notification(&mem).unwrap_err();
            assert_eq!(err.kind(), pattern.expected(), "{pattern:?}: {err}");
            assert!(!err.is_chain_fault());
            // The queue keeps serving once the driver writes sane values.
            driver.set_driver_event(0, EVENT_FLAG_ENABLE).unwrap();
            assert!(queue.needs_notification(&mem).unwrap());
            round_trip(&mut walker, &mut driver, &mut queue, &mem, Layout::Indirect);
            continue;
        }
        for _ in 0..pattern.valid_before() {
            let c = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
            drop(c);
        }
        let before = queue.next_avail();
        let err = queue.pop_chain(&mut walker, &mem).unwrap_err();
        assert_eq!(err.kind(), pattern.expected(), "{pattern:?}: {err}");
        if pattern.breaks_ring() {
            // Nothing consumed, the same error again, no panic.
            assert!(!err.is_chain_fault(), "{pattern:?}");
            assert_eq!(queue.next_avail(), before, "{pattern:?}");
            let again = queue.pop_chain(&mut walker, &mem).unwrap_err();
            assert_eq!(again.kind(), pattern.expected());
            continue;
        }
        assert!(err.is_chain_fault(), "{pattern:?}");
        assert_ne!(queue.next_avail(), before, "{pattern:?} consumed");
        let used = driver.take_used();
        match pattern.expected() {
            // Not returnable: nothing in the used ring for it.
            ErrorKind::BufferIdOutOfRange | ErrorKind::BufferIdInFlight => {
                assert!(used.is_empty(), "{pattern:?}: {used:?}")
            }
            _ => assert_eq!(used.len(), 1, "{pattern:?}: returned with length 0"),
        }
        // The next valid chain is served.
        let laid = driver
            .add_chain_with_data(Layout::Direct, &[b"still alive"], &[8])
            .unwrap();
        let chain = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
        assert_eq!(chain.head_index(), laid.head, "{pattern:?}");
        let mut got = Vec::new();
        chain.reader().read_to_end(&mut got).unwrap();
        assert_eq!(got, b"still alive");
    }
}

#[test]
fn test_chain_crossing_the_ring_end_into_a_stale_slot() {
    // A chain at the last slot sets NEXT; slot 0 still holds the previous
    // lap's descriptor (available for wrap 1, so not for wrap 0).
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 4);
    let mut queue = driver.create_queue();
    let mut walker = large();
    for _ in 0..3 {
        // Chains of one slot: the next avail slot becomes 3.
        let laid = driver.add_chain(Layout::Direct, &[Buf::r(8)]).unwrap();
        let c = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
        queue.add_used(&mem, c.head_index(), 0).unwrap();
        assert_eq!(
            driver.take_used(),
            vec![UsedEntry {
                id: u32::from(laid.head),
                len: 0
            }]
        );
    }
    assert_eq!(queue.next_avail(), (3, true));
    // Slot 0 keeps the used descriptor (AVAIL = USED = 1) of the first lap.
    driver
        .publish(&[pdesc(0x10000, 8, 1, F_NEXT)], 1, false, false)
        .unwrap();
    let err = queue.pop_chain(&mut walker, &mem).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DescriptorNotAvailable {
                slot: 0,
                position: 1,
                wrap: false
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "packed ring: descriptor 0 (1 of the chain) is not available for wrap counter false"
    );
}

#[test]
fn test_used_id_not_in_flight_is_refused() {
    let mem = guest_memory(1 << 20);
    let driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    for id in [0, 7, 8, u16::MAX] {
        let err = queue.add_used(&mem, id, 0).unwrap_err();
        assert!(matches!(err, Error::UsedIdNotInFlight { .. }), "{err}");
    }
    assert_eq!(queue.next_used(), (0, true));
}

#[test]
fn test_event_suppression_modes() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    let mut walker = large();

    // Device area: disable, enable, and event-idx at the next avail slot.
    queue.disable_notification(&mem).unwrap();
    assert_eq!(driver.device_event().flags(), EVENT_FLAG_DISABLE);
    assert!(!queue.enable_notification(&mem).unwrap());
    assert_eq!(
        driver.device_event(),
        EventSuppression::new(0, EVENT_FLAG_ENABLE)
    );
    driver.add_chain(Layout::Direct, &[Buf::r(8)]).unwrap();
    assert!(
        queue.enable_notification(&mem).unwrap(),
        "a chain is pending"
    );
    queue.set_event_idx(true);
    let c = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
    queue.enable_notification(&mem).unwrap();
    assert_eq!(driver.device_event(), EventSuppression::new(1 | 0x8000, 2));

    // Driver area, plain modes.
    driver.set_driver_event(0, EVENT_FLAG_DISABLE).unwrap();
    queue.add_used(&mem, c.head_index(), 0).unwrap();
    assert!(!queue.needs_notification(&mem).unwrap());
    driver.set_driver_event(0, EVENT_FLAG_ENABLE).unwrap();
    assert!(queue.needs_notification(&mem).unwrap());
    driver.take_used();

    // Event-idx: notify exactly when the used position passes the event.
    // Ten one-slot chains on an 8-slot ring cross the wrap.
    driver.set_used_event(3, true).unwrap();
    let mut notified = Vec::new();
    for i in 1..=10u16 {
        driver.add_chain(Layout::Direct, &[Buf::r(8)]).unwrap();
        let c = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
        queue.add_used(&mem, c.head_index(), 0).unwrap();
        driver.take_used();
        if queue.needs_notification(&mem).unwrap() {
            notified.push(i);
        }
        if i == 5 {
            // Next lap's slot 1: after the used position wraps.
            driver.set_used_event(1, false).unwrap();
        }
    }
    // Used position after chain i is (1 + i) % 8: slot 3 is passed with
    // chain 3 (position 3 -> 4); lap 0's slot 1 with chain 9 (1 -> 2).
    assert_eq!(notified, vec![3, 9]);
    // Nothing used since: no notification.
    assert!(!queue.needs_notification(&mem).unwrap());
}

#[test]
fn test_event_mode_parse_limits() {
    let p =
        |off_wrap, flags, idx| EventMode::parse(EventSuppression::new(off_wrap, flags), 16, idx);
    assert_eq!(p(0, 0, false).unwrap(), EventMode::Enable);
    assert_eq!(p(0, 1, true).unwrap(), EventMode::Disable);
    assert_eq!(
        p(15 | 0x8000, 2, true).unwrap(),
        EventMode::Desc {
            off: 15,
            wrap: true
        }
    );
    assert_eq!(
        p(16, 2, true).unwrap_err().kind(),
        ErrorKind::EventOffsetOutOfRange
    );
    assert_eq!(
        p(0, 2, false).unwrap_err().kind(),
        ErrorKind::EventFlagsInvalid
    );
    for flags in [3, 4, 0x8000, u16::MAX] {
        assert_eq!(
            p(0, flags, true).unwrap_err().kind(),
            ErrorKind::EventFlagsInvalid
        );
    }
    assert_eq!(
        p(0, 3, true).unwrap_err().to_string(),
        "packed ring: invalid driver event suppression flags 0x3 (event-idx true)"
    );
}

#[test]
fn test_vhost_user_ring_base_round_trip() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    let mut walker = large();
    // Fresh ring: positions 0 with both wrap counters 1.
    assert_eq!(queue.ring_base(), 0x8000_8000);
    for _ in 0..10 {
        round_trip(&mut walker, &mut driver, &mut queue, &mem, Layout::Direct);
    }
    // 10 chains of 4 slots: 40 = 5 laps of 8, wrap flipped 5 times.
    assert_eq!(queue.next_avail(), (0, false));
    let base = queue.ring_base();
    assert_eq!(base, 0);

    // A new queue (a restarted backend) resumes from the base.
    let mut resumed = driver.create_queue();
    resumed.set_ring_base(base).unwrap();
    assert_eq!(resumed.next_avail(), (0, false));
    round_trip(
        &mut walker,
        &mut driver,
        &mut resumed,
        &mem,
        Layout::Indirect,
    );
    assert_eq!(resumed.ring_base(), 0x0001_0001);

    // Out of range: refused, nothing changed.
    for bad in [8u32, 0x8008, 8 << 16, 0xffff_ffff] {
        let err = resumed.set_ring_base(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidRingBase { .. }), "{err}");
    }
    assert_eq!(resumed.ring_base(), 0x0001_0001);
}

#[test]
fn test_from_queue_reads_the_vhost_user_avail_base() {
    let mut split = Queue::new(64).unwrap();
    split.set_size(64);
    split.set_desc_table_address(Some(0x1000), Some(0));
    split.set_avail_ring_address(Some(0x2000), Some(0));
    split.set_used_ring_address(Some(0x2004), Some(0));
    split.set_ready(true);
    split.set_event_idx(true);
    // vhost-user-backend stores SET_VRING_BASE's low 16 bits here.
    split.set_next_avail(5);
    let q = PackedQueue::from_queue(&split).unwrap();
    assert_eq!(q.next_avail(), (5, false));
    assert_eq!(q.next_used(), (5, false));
    assert!(q.ready() && q.event_idx_enabled());
    assert_eq!(
        q.addresses(),
        (
            GuestAddress(0x1000),
            GuestAddress(0x2000),
            GuestAddress(0x2004)
        )
    );
    split.set_next_avail(0x8000 | 63);
    assert_eq!(
        PackedQueue::from_queue(&split).unwrap().next_avail(),
        (63, true)
    );
    split.set_next_avail(64);
    assert!(PackedQueue::from_queue(&split).is_err());

    // And back, for GET_VRING_BASE through vhost-user-backend.
    let mut q =
        PackedQueue::new(64, GuestAddress(0x1000), GuestAddress(0), GuestAddress(4)).unwrap();
    q.set_ring_base(0x8000 | 17).unwrap();
    assert_eq!(q.avail_base(), 0x8000 | 17);
    q.sync_to(&mut split);
    assert_eq!(split.next_avail(), 0x8000 | 17);
}

#[test]
fn test_queue_configuration_is_checked() {
    let a = GuestAddress(0x1000);
    for (size, ring, area) in [
        (0, a, a),
        (32769, a, a),
        (8, GuestAddress(0x1008), a),
        (8, a, GuestAddress(0x1002)),
    ] {
        let err = PackedQueue::new(size, ring, area, area).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidQueueConfig);
    }
    // Not a power of two is fine for packed rings.
    assert!(PackedQueue::new(3, a, a, a).is_ok());

    let mem = guest_memory(1 << 20);
    let mut q = PackedQueue::new(8, a, a, a).unwrap();
    let mut walker = large();
    assert_eq!(
        q.pop_chain(&mut walker, &mem).unwrap_err().kind(),
        ErrorKind::QueueNotReady
    );
    // A ring that runs past the end of guest memory, its head available.
    let ring = GuestAddress((1 << 20) - 16);
    mem.write_obj(pdesc(0x1000, 8, 0, avail_bits(true)), ring)
        .unwrap();
    let mut q = PackedQueue::new(8, ring, a, a).unwrap();
    q.set_ready(true);
    let err = q.pop_chain(&mut walker, &mem).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RingOutsideMemory);
    assert!(!err.is_chain_fault(), "{err}");
}

/// One request path for both layouts, as a device would write it.
fn serve<R: DeviceRing>(ring: &mut R, walker: &mut ChainWalker, mem: &GuestMemoryMmap) -> usize {
    let mut served = 0;
    loop {
        ring.disable_kicks(mem).unwrap();
        while let Some(chain) = ring.pop_chain(walker, mem).unwrap() {
            let mut req = Vec::new();
            chain.reader().read_to_end(&mut req).unwrap();
            let mut w = chain.writer();
            w.write_all(&req).unwrap();
            ring.push_used(mem, chain.head_index(), w.bytes_written() as u32)
                .unwrap();
            served += 1;
        }
        let _ = ring.notify_needed(mem).unwrap();
        if !ring.enable_kicks(mem).unwrap() {
            return served;
        }
    }
}

#[test]
fn test_one_request_path_serves_split_and_packed() {
    let mem = guest_memory(1 << 20);
    let mut walker = large();

    let mut split_driver = MockDriver::new(&mem, 16);
    let mut split: Queue = split_driver.create_queue();
    for _ in 0..3 {
        split_driver
            .add_chain_with_data(Layout::Indirect, &[b"abc"], &[3])
            .unwrap();
    }
    assert_eq!(serve(&mut AnyRing::Split(&mut split), &mut walker, &mem), 3);
    assert_eq!(split_driver.take_used().len(), 3);

    let mem2 = guest_memory(1 << 20);
    let mut packed_driver = MockPackedDriver::new(&mem2, 16);
    let mut packed = packed_driver.create_queue();
    for _ in 0..3 {
        packed_driver
            .add_chain_with_data(Layout::Indirect, &[b"abc"], &[3])
            .unwrap();
    }
    assert_eq!(
        serve(
            &mut AnyRing::<Queue>::Packed(&mut packed),
            &mut walker,
            &mem2
        ),
        3
    );
    assert_eq!(
        packed_driver.take_used(),
        vec![
            UsedEntry { id: 0, len: 3 },
            UsedEntry { id: 1, len: 3 },
            UsedEntry { id: 2, len: 3 },
        ]
    );
    assert_eq!(
        AnyRing::<Queue>::Packed(&mut packed).ring_base(),
        packed.ring_base()
    );
}

#[test]
fn test_event_idx_notifies_after_a_whole_lap_unsignalled() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 4);
    let mut queue = driver.create_queue();
    queue.set_event_idx(true);
    let mut walker = large();
    // An event the used position passes only at the very start of the run.
    driver.set_used_event(0, true).unwrap();
    assert!(!queue.needs_notification(&mem).unwrap());
    for _ in 0..5 {
        driver.add_chain(Layout::Direct, &[Buf::r(8)]).unwrap();
        let c = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
        queue.add_used(&mem, c.head_index(), 0).unwrap();
        driver.take_used();
    }
    // Five slots used on a ring of four since the last check: every event passed.
    assert!(queue.needs_notification(&mem).unwrap());
}

#[test]
fn test_a_restarted_device_skips_what_was_used_and_serves_a_recorded_chain() {
    // Three one-slot (indirect) chains popped; the second and third are
    // used, which overwrites the first one's slot; then the device
    // "crashes" and a new one starts at the used position, as a frontend
    // that lost its backend rewinds it.
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    let mut walker = large();
    let (desc_ring, _, _) = queue.addresses();
    let mut laid = Vec::new();
    for (i, payload) in [b"first ", b"second", b"third "].iter().enumerate() {
        laid.push(
            driver
                .add_chain_with_data(Layout::Indirect, &[payload.as_slice()], &[16])
                .unwrap(),
        );
        let _ = i;
    }
    let mut recorded = [0u8; 16];
    mem.read_slice(&mut recorded, desc_ring).unwrap();
    let chains: Vec<_> = (0..3)
        .map(|_| queue.pop_chain(&mut walker, &mem).unwrap().unwrap())
        .collect();
    for c in &chains[1..] {
        queue.add_used(&mem, c.head_index(), 0).unwrap();
    }
    assert_eq!(driver.take_used().len(), 2);
    drop(chains);

    let mut fresh = driver.create_queue();
    let (slot, wrap) = driver.used_position();
    let pos = u32::from(virtqueue_large::packed::encode_position(slot, wrap));
    fresh.set_ring_base(pos | (pos << 16)).unwrap();
    // The third chain is offered again: skipped, nothing written.
    assert!(fresh.skip_available(&mem, 1).unwrap());
    assert!(!fresh.skip_available(&mem, 1).unwrap(), "nothing more");
    assert!(fresh.skip_available(&mem, 0).is_err());
    // The first is not offered again: served from its recorded slot.
    let chain = walker
        .walk_packed_descriptor(&mem, recorded, fresh.size())
        .unwrap();
    assert_eq!(chain.head_index(), laid[0].head);
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, b"first ");
    fresh.adopt(chain.head_index(), 1).unwrap();
    assert!(matches!(
        fresh.adopt(chain.head_index(), 1),
        Err(Error::BufferIdInFlight { .. })
    ));
    assert!(fresh.adopt(8, 1).is_err());
    let mut w = chain.writer();
    w.write_all(b"late").unwrap();
    fresh.add_used(&mem, chain.head_index(), 4).unwrap();
    assert_eq!(
        driver.take_used(),
        vec![UsedEntry {
            id: u32::from(laid[0].head),
            len: 4
        }]
    );
    assert_eq!(&driver.read_writable(&laid[0]).unwrap()[..4], b"late");
    // A recorded descriptor that continues in the next slot is refused.
    let mut next = recorded;
    next[14] |= F_NEXT as u8;
    assert!(walker.walk_packed_descriptor(&mem, next, 8).is_err());
}

#[test]
fn test_skip_available_on_a_split_ring() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 8);
    let mut q: Queue = driver.create_queue();
    driver
        .add_chain_with_data(Layout::Direct, &[b"x"], &[4])
        .unwrap();
    let mut ring = AnyRing::Split(&mut q);
    assert_eq!(ring.used_position(), 0);
    assert!(ring.skip_available(&mem, 1).unwrap());
    assert!(!ring.skip_available(&mem, 1).unwrap());
    assert_eq!(ring.ring_base(), 1);
    assert_eq!(ring.used_position(), 0, "nothing used");
}
