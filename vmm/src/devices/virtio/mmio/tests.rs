//! Unit tests of the virtio-mmio transport against a dummy device.

use super::*;
use crate::devices::virtio::test_utils::{mem, DummyDevice};
use crate::persist::Persist;
use status::*;

#[test]
fn status_transitions_exhaustive() {
    const ADFO: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK;
    let mut expected = std::collections::HashSet::new();
    for from in 0..=0xffu32 {
        expected.insert((from, 0u32));
    }
    expected.insert((0, ACKNOWLEDGE));
    expected.insert((ACKNOWLEDGE, ACKNOWLEDGE | DRIVER));
    expected.insert((ACKNOWLEDGE | DRIVER, ACKNOWLEDGE | DRIVER | FEATURES_OK));
    expected.insert((ACKNOWLEDGE | DRIVER | FEATURES_OK, ADFO));
    // FAILED may be added to any state made only of the four init bits.
    for from in 0..=0xffu32 {
        if from & !ADFO == 0 {
            expected.insert((from, from | FAILED));
        }
    }
    for from in 0..=0xffu32 {
        for to in 0..=0xffu32 {
            assert_eq!(
                valid_transition(from, to),
                expected.contains(&(from, to)),
                "{from:#x} -> {to:#x}"
            );
        }
    }
}

fn rd(t: &mut MmioTransport, off: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(off, &mut b);
    u32::from_le_bytes(b)
}
fn wr(t: &mut MmioTransport, off: u64, v: u32) {
    t.write(off, &v.to_le_bytes());
}

fn transport() -> (MmioTransport, Arc<Mutex<DummyDevice>>) {
    let d = Arc::new(Mutex::new(DummyDevice::new(&[16, 8])));
    let t = MmioTransport::new(mem(), d.clone());
    (t, d)
}

fn setup_queue(t: &mut MmioTransport, i: u32, base: u64, size: u32) {
    wr(t, REG_QUEUE_SEL, i);
    wr(t, REG_QUEUE_NUM, size);
    wr(t, REG_QUEUE_DESC_LOW, base as u32);
    wr(t, REG_QUEUE_DESC_HIGH, (base >> 32) as u32);
    wr(t, REG_QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
    wr(t, REG_QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
    wr(t, REG_QUEUE_READY, 1);
}

fn negotiate(t: &mut MmioTransport) {
    wr(t, REG_STATUS, ACKNOWLEDGE);
    wr(t, REG_STATUS, ACKNOWLEDGE | DRIVER);
    wr(t, REG_DRIVER_FEATURES_SEL, 1);
    wr(t, REG_DRIVER_FEATURES, 1); // VERSION_1
    wr(t, REG_DRIVER_FEATURES_SEL, 0);
    wr(t, REG_DRIVER_FEATURES, 1 << 3);
    wr(t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
}

#[test]
fn a_guest_hammering_bad_registers_cannot_flood_the_log() {
    use crate::logging::{capture, BURST};
    let (mut t, _) = transport();
    let lines = capture::lines_of(|| {
        for i in 0..10_000 {
            wr(&mut t, 0xf0, i);
            let _ = rd(&mut t, 0xf4);
            wr(&mut t, REG_QUEUE_SEL, 9);
            wr(&mut t, REG_QUEUE_NUM, 4);
        }
    });
    // Three call sites (unknown write, unknown read, queue write too early), each limited.
    assert!(
        lines.len() <= 3 * BURST as usize,
        "{} lines, first {:?}",
        lines.len(),
        &lines[..5.min(lines.len())]
    );
    assert!(lines
        .iter()
        .any(|l| l.contains("unknown/read-only register 0xf0")));
    assert!(lines
        .iter()
        .any(|l| l.contains("unknown/write-only register 0xf4")));
    assert!(lines.iter().any(|l| l.contains("QueueNum write")));
}

#[test]
fn identification_registers() {
    let (mut t, _) = transport();
    assert_eq!(rd(&mut t, REG_MAGIC), 0x7472_6976);
    assert_eq!(rd(&mut t, REG_VERSION), 2);
    assert_eq!(rd(&mut t, REG_DEVICE_ID), 42);
    wr(&mut t, REG_DEVICE_FEATURES_SEL, 0);
    assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 1 << 3);
    wr(&mut t, REG_DEVICE_FEATURES_SEL, 1);
    assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 1);
    wr(&mut t, REG_DEVICE_FEATURES_SEL, 2);
    assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 0);
    wr(&mut t, REG_QUEUE_SEL, 1);
    assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 8);
    wr(&mut t, REG_QUEUE_SEL, 7);
    assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 0);
    // Narrow register accesses are ignored and read as zero.
    let mut b = [0xffu8; 2];
    t.read(REG_MAGIC, &mut b);
    assert_eq!(b, [0, 0]);
}

#[test]
fn full_init_activates_and_reset_deactivates() {
    let (mut t, d) = transport();
    negotiate(&mut t);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(
        d.lock().unwrap().common.acked_features(),
        (1 << 32) | (1 << 3)
    );
    setup_queue(&mut t, 0, 0x10000, 16);
    setup_queue(&mut t, 1, 0x20000, 4);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert_eq!(
        rd(&mut t, REG_STATUS),
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
    );
    {
        let dev = d.lock().unwrap();
        assert!(dev.active);
        assert_eq!(dev.activated_queues[1].size(), 4);
        assert_eq!(dev.activated_queues[0].desc_table(), 0x10000);
    }
    let st = t.save();
    assert_eq!(st.queues[1].size, 4);
    assert!(st.queues[0].ready);
    // Queue setup after DRIVER_OK is refused.
    wr(&mut t, REG_QUEUE_SEL, 0);
    wr(&mut t, REG_QUEUE_DESC_LOW, 0x5000);
    assert_eq!(t.save().queues[0].desc_table, 0x10000);
    // Reset.
    wr(&mut t, REG_STATUS, 0);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
    assert!(!d.lock().unwrap().active);
    assert_eq!(
        t.save().queues[0],
        QueueSnapshot {
            max_size: 16,
            size: 16,
            ..Default::default()
        }
        .with_default_addrs()
    );
    // And it can be brought up again.
    negotiate(&mut t);
    setup_queue(&mut t, 0, 0x10000, 16);
    setup_queue(&mut t, 1, 0x20000, 8);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert!(d.lock().unwrap().active);
}

#[test]
fn event_idx_follows_the_driver_and_is_part_of_the_queue_state() {
    use crate::devices::virtio::notify::VIRTIO_RING_F_EVENT_IDX;
    for acked in [false, true] {
        let d = Arc::new(Mutex::new(DummyDevice::with_features(
            &[16, 8],
            1 << VIRTIO_RING_F_EVENT_IDX,
        )));
        let mut t = MmioTransport::new(mem(), d.clone());
        wr(&mut t, REG_STATUS, ACKNOWLEDGE);
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
        wr(&mut t, REG_DRIVER_FEATURES_SEL, 1);
        wr(&mut t, REG_DRIVER_FEATURES, 1);
        wr(&mut t, REG_DRIVER_FEATURES_SEL, 0);
        wr(
            &mut t,
            REG_DRIVER_FEATURES,
            if acked {
                1 << VIRTIO_RING_F_EVENT_IDX
            } else {
                0
            },
        );
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        setup_queue(&mut t, 0, 0x10000, 16);
        setup_queue(&mut t, 1, 0x20000, 8);
        wr(
            &mut t,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        let dev = d.lock().unwrap();
        assert!(dev.active);
        for q in &dev.activated_queues {
            assert_eq!(q.event_idx_enabled(), acked);
        }
        drop(dev);
        let saved = t.save();
        assert!(saved.queues.iter().all(|q| q.event_idx == acked));
        // A restored device gets it back: its queues suppress notifications and
        // interrupts exactly as the driver expects.
        let d2 = Arc::new(Mutex::new(DummyDevice::with_features(
            &[16, 8],
            1 << VIRTIO_RING_F_EVENT_IDX,
        )));
        let args = TransportArgs {
            mem: mem(),
            device: d2.clone(),
        };
        let restored = MmioTransport::restore(args, &saved).unwrap();
        let dev2 = d2.lock().unwrap();
        assert!(dev2.active);
        assert_eq!(dev2.activated_queues.len(), 2);
        for q in &dev2.activated_queues {
            assert_eq!(q.event_idx_enabled(), acked);
        }
        drop(dev2);
        assert_eq!(restored.save().queues, saved.queues);
        // A reset forgets it.
        wr(&mut t, REG_STATUS, 0);
        assert!(t.save().queues.iter().all(|q| !q.event_idx));
    }
}

impl QueueSnapshot {
    fn with_default_addrs(self) -> Self {
        let q = Queue::new(self.max_size).unwrap();
        Self {
            desc_table: q.desc_table(),
            avail_ring: q.avail_ring(),
            used_ring: q.used_ring(),
            ..self
        }
    }
}

#[test]
fn features_refused_without_version_1_or_with_unoffered_bits() {
    let (mut t, _) = transport();
    wr(&mut t, REG_STATUS, ACKNOWLEDGE);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
    wr(&mut t, REG_DRIVER_FEATURES, 1 << 3);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
    wr(&mut t, REG_DRIVER_FEATURES_SEL, 1);
    wr(&mut t, REG_DRIVER_FEATURES, 1 | 2); // VERSION_1 + an unoffered bit
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
    wr(&mut t, REG_DRIVER_FEATURES, 1);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
    // Features are frozen after FEATURES_OK.
    assert_eq!(t.save().acked_features, (1 << 32) | (1 << 3));
    wr(&mut t, REG_DRIVER_FEATURES_SEL, 0);
    wr(&mut t, REG_DRIVER_FEATURES, 0);
    assert_eq!(t.save().acked_features, (1 << 32) | (1 << 3));
}

#[test]
fn invalid_transitions_ignored() {
    let (mut t, d) = transport();
    wr(&mut t, REG_STATUS, DRIVER_OK);
    assert_eq!(rd(&mut t, REG_STATUS), 0);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE);
    assert!(!d.lock().unwrap().active);
    wr(&mut t, REG_STATUS, ACKNOWLEDGE | FAILED);
    assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | FAILED);
}

#[test]
fn queue_setup_rules_and_bad_sizes() {
    let (mut t, _) = transport();
    // Before FEATURES_OK queue writes are ignored.
    wr(&mut t, REG_QUEUE_NUM, 4);
    assert_eq!(t.save().queues[0].size, 16);
    negotiate(&mut t);
    wr(&mut t, REG_QUEUE_NUM, 3); // not a power of two
    assert_eq!(t.save().queues[0].size, 16);
    wr(&mut t, REG_QUEUE_NUM, 32); // above max
    assert_eq!(t.save().queues[0].size, 16);
    wr(&mut t, REG_QUEUE_NUM, 0x10004); // does not fit u16
    assert_eq!(t.save().queues[0].size, 16);
    wr(&mut t, REG_QUEUE_NUM, 4);
    assert_eq!(t.save().queues[0].size, 4);
    wr(&mut t, REG_QUEUE_SEL, 9);
    wr(&mut t, REG_QUEUE_NUM, 4); // missing queue: ignored, no panic
    wr(&mut t, REG_QUEUE_READY, 1);
}

#[test]
fn driver_ok_with_invalid_queue_sets_needs_reset() {
    let (mut t, d) = transport();
    negotiate(&mut t);
    setup_queue(&mut t, 0, 0x10000, 16);
    // Queue 1 points outside guest memory.
    setup_queue(&mut t, 1, 0x7fff_0000_0000, 8);
    wr(
        &mut t,
        REG_STATUS,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    );
    assert!(!d.lock().unwrap().active);
    assert_eq!(rd(&mut t, REG_STATUS) & NEEDS_RESET, NEEDS_RESET);
    assert_eq!(
        rd(&mut t, REG_INTERRUPT_STATUS),
        crate::devices::virtio::INT_CONFIG
    );
    wr(
        &mut t,
        REG_INTERRUPT_ACK,
        crate::devices::virtio::INT_CONFIG,
    );
    assert_eq!(rd(&mut t, REG_INTERRUPT_STATUS), 0);
    // Reset clears NEEDS_RESET.
    wr(&mut t, REG_STATUS, NEEDS_RESET); // driver echoes the bit: treated as 0 = reset
    assert_eq!(rd(&mut t, REG_STATUS), 0);
}

#[test]
fn notify_reaching_the_bus_signals_the_queue_eventfd() {
    let (mut t, d) = transport();
    wr(&mut t, REG_QUEUE_NOTIFY, 1);
    assert_eq!(d.lock().unwrap().queue_events()[1].read().unwrap(), 1);
    wr(&mut t, REG_QUEUE_NOTIFY, 5); // missing queue: ignored
}

#[test]
fn config_space_is_forwarded() {
    let (mut t, d) = transport();
    let mut b = [0u8; 2];
    t.read(REG_CONFIG + 1, &mut b);
    assert_eq!(b, [1, 2]);
    t.write(REG_CONFIG + 3, &[9]);
    assert_eq!(d.lock().unwrap().config[3], 9);
}
