//! The oracle: what the virtio-blk rules say each request must do, and the checks after a
//! kick (completions, statuses, used lengths, guest memory written, interrupts).

use super::*;

impl Run {
    /// What the virtio-blk rules say about `p`.
    pub(super) fn expect(&self, p: &Pending) -> Expect {
        match (p.mistake, self.expect_clean(p)) {
            // Contiguous in guest-physical space across two mappings: the device may process the
            // request normally or refuse the buffer.
            // A discard/write-zeroes payload moved there is not this request's own: the bytes
            // at that fixed address may be rewritten by requests submitted after it (their
            // slots can overlap it) before the device reads them, so the device may see other
            // segments and answer anything a payload can get.
            (Mistake::DataOutside(sel), Expect::Status(_))
                if sel % 4 == 1 && matches!(p.kind, Kind::Discard | Kind::WriteZeroes) =>
            {
                Expect::Status(vec![
                    VIRTIO_BLK_S_OK,
                    VIRTIO_BLK_S_IOERR,
                    VIRTIO_BLK_S_UNSUPP,
                ])
            }
            (Mistake::DataOutside(sel), Expect::Status(mut v)) if sel % 4 == 1 => {
                if !v.contains(&VIRTIO_BLK_S_IOERR) {
                    v.push(VIRTIO_BLK_S_IOERR);
                }
                Expect::Status(v)
            }
            (_, e) => e,
        }
    }

    pub(super) fn expect_clean(&self, p: &Pending) -> Expect {
        use Mistake::*;
        let ioerr = Expect::Status(vec![VIRTIO_BLK_S_IOERR]);
        let ok = Expect::Status(vec![VIRTIO_BLK_S_OK]);
        let unsupp = Expect::Status(vec![VIRTIO_BLK_S_UNSUPP]);
        match p.mistake {
            StatusReadOnly | StatusOutside => return Expect::Fatal,
            HeaderWritable | HeaderShort(_) => return ioerr,
            WrongDirection => {
                return match p.kind {
                    Kind::Flush => ok,
                    Kind::Other(_) => unsupp,
                    _ => ioerr,
                }
            }
            DataOutside(sel) if sel % 4 != 1 => return ioerr,
            DataOutside(_) | None => {}
        }
        let cap = self.model.capacity();
        let in_range = |sector: u64, len: u64| {
            sector
                .checked_mul(SECTOR)
                .and_then(|o| o.checked_add(len))
                .is_some_and(|end| end <= cap)
        };
        match p.kind {
            Kind::In | Kind::Out => {
                let len = p.data_len();
                if (p.kind == Kind::Out && self.ro)
                    || !len.is_multiple_of(SECTOR)
                    || !in_range(p.sector, len)
                {
                    ioerr
                } else {
                    ok
                }
            }
            Kind::Flush => ok,
            Kind::GetId => {
                if p.data.len() == 1 {
                    ok
                } else {
                    ioerr
                }
            }
            Kind::Discard | Kind::WriteZeroes => {
                let n = p.payload_len / 16;
                if self.ro
                    || p.payload_len == 0
                    || !p.payload_len.is_multiple_of(16)
                    || n > u64::from(MAX_DISCARD_SEG)
                    || p.segments.iter().any(|&(s, num, _)| {
                        num > MAX_DISCARD_SECTORS || !in_range(s, u64::from(num) * SECTOR)
                    })
                {
                    return ioerr;
                }
                let allowed = if p.kind == Kind::Discard { 0 } else { 1 };
                if p.segments.iter().any(|&(_, _, f)| f & !allowed != 0) {
                    unsupp
                } else {
                    ok
                }
            }
            Kind::Other(_) => unsupp,
        }
    }

    /// Publish, let the device process the queue, check every completion.
    pub(super) fn kick(&mut self) {
        self.q.publish(&self.mem);
        let before = MemSnapshot::take(&self.mem);
        let was_broken = self.broken;
        crate::driver::blk_process(self.dev());
        let done = self.q.take_used(&self.mem);
        let irq = self.dev().interrupt().status();
        self.dev().interrupt().ack(INT_VRING | INT_CONFIG);
        if self.tainted {
            self.pending.clear();
            self.order.clear();
            self.broken |= self.dev().is_broken();
            return;
        }
        if was_broken {
            assert!(
                done.is_empty(),
                "a device that needs a reset completed chains"
            );
            assert!(
                before.changed(&self.mem).is_empty(),
                "a device that needs a reset wrote guest memory"
            );
            return;
        }
        let changed = before.changed(&self.mem);
        let chains: Vec<_> = done.iter().map(|(_, _, c)| c).collect();
        assert_writes_within(
            &changed,
            &writable_ranges(&chains, &[&self.q]),
            "virtio-blk",
        );
        if !done.is_empty() {
            assert_ne!(
                irq & INT_VRING,
                0,
                "chains completed without a used-buffer interrupt"
            );
        }
        let mut fatal_seen = false;
        for (head, len, _) in &done {
            // Malformed requests are answered at once, the others when the device's I/O
            // thread finishes them, so completions need not follow the available order
            // (virtio allows any order); each must be of a chain made available and not yet
            // completed.
            let at = self.order.iter().position(|h| h == head);
            assert!(
                at.is_some(),
                "chain {head} completed but was not outstanding ({:?})",
                self.order
            );
            self.order.remove(at.expect("checked"));
            let p = self.pending.remove(head).expect("pending request");
            trace!(
                "blk: {:?} sector {} {:?} completed, used length {len}",
                p.kind,
                p.sector,
                p.mistake
            );
            self.complete(&p, *len);
        }
        // What did not complete: nothing, or everything from a chain without a status byte on.
        if let Some(&head) = self.order.front() {
            let p = &self.pending[&head];
            assert_eq!(
                self.expect(p),
                Expect::Fatal,
                "request {:?} at sector {} ({:?}) was made available but did not complete",
                p.kind,
                p.sector,
                p.mistake
            );
            fatal_seen = true;
        }
        assert_eq!(
            self.dev().is_broken(),
            fatal_seen,
            "device broken state after a chain {} a usable status byte",
            if fatal_seen { "without" } else { "with" }
        );
        if fatal_seen {
            assert!(
                self.dev().interrupt().needs_reset(),
                "a chain without a status byte must set NEEDS_RESET"
            );
            assert_ne!(
                irq & INT_CONFIG,
                0,
                "NEEDS_RESET without a configuration interrupt"
            );
            self.broken = true;
        }
    }

    /// Check one completed request against the model and apply its effects.
    pub(super) fn complete(&mut self, p: &Pending, used_len: u32) {
        let status: u8 = self
            .mem
            .read_obj(GuestAddress(p.status_addr))
            .expect("status byte");
        let what = format!(
            "{:?} sector {} data {:?} mistake {:?}",
            p.kind,
            p.sector,
            p.data.iter().map(|b| b.len).collect::<Vec<_>>(),
            p.mistake
        );
        let allowed = match self.expect(p) {
            Expect::Fatal => panic!("{what}: completed, but it has no usable status byte"),
            Expect::Status(s) => s,
        };
        assert!(
            allowed.contains(&status),
            "{what}: status {status:#x}, expected one of {allowed:?}"
        );
        let off = p.sector.wrapping_mul(SECTOR);
        let exact = p.mistake == Mistake::None;
        match (p.kind, status) {
            (Kind::In, VIRTIO_BLK_S_OK) => {
                let len = p.data_len() as u32;
                assert_eq!(used_len, len + 1, "{what}: used length of a read");
                if !exact {
                    return; // another request may share the misplaced buffer
                }
                let mut got = Vec::new();
                for b in &p.data {
                    let mut v = vec![0u8; b.len as usize];
                    self.mem
                        .read_slice(&mut v, GuestAddress(b.addr))
                        .expect("data buffer");
                    got.extend_from_slice(&v);
                }
                self.model.check_read(off, &got, &what);
            }
            (Kind::Out, VIRTIO_BLK_S_OK) => {
                assert_eq!(used_len, 1, "{what}: used length of a write");
                if exact {
                    self.model.write(off, &p.out_data);
                } else {
                    self.model.forget(off, p.data_len());
                }
            }
            (Kind::GetId, VIRTIO_BLK_S_OK) => {
                let b = p.data[0];
                let n = (b.len as usize).min(SERIAL.len());
                assert_eq!(used_len, n as u32 + 1, "{what}: used length of GET_ID");
                if !exact {
                    return;
                }
                let mut v = vec![0u8; n];
                self.mem
                    .read_slice(&mut v, GuestAddress(b.addr))
                    .expect("id buffer");
                assert_eq!(v, SERIAL[..n], "{what}: GET_ID answer");
            }
            (Kind::Discard | Kind::WriteZeroes, VIRTIO_BLK_S_OK) if exact => {
                assert_eq!(used_len, 1, "{what}: used length");
                for &(s, num, _) in &p.segments {
                    self.model.zero(s * SECTOR, u64::from(num) * SECTOR);
                }
            }
            (Kind::Discard | Kind::WriteZeroes, VIRTIO_BLK_S_OK | VIRTIO_BLK_S_UNSUPP) if matches!(p.mistake, Mistake::DataOutside(sel) if sel % 4 == 1) =>
            {
                // The device acted on whatever segments it found there (see `expect`).
                assert_eq!(used_len, 1, "{what}: used length");
                self.model.forget_all();
            }
            (Kind::Discard | Kind::WriteZeroes, VIRTIO_BLK_S_OK | VIRTIO_BLK_S_UNSUPP) => {
                assert_eq!(used_len, 1, "{what}: used length");
                // Segments before the one with unsupported flags may have been applied.
                for &(s, num, _) in &p.segments {
                    if let Some(o) = s.checked_mul(SECTOR) {
                        self.model.forget(o, u64::from(num) * SECTOR);
                    }
                }
            }
            (Kind::Out, VIRTIO_BLK_S_IOERR) if matches!(p.mistake, Mistake::DataOutside(_)) => {
                // A buffer the device could not reach: part of the write may have happened.
                assert_eq!(used_len, 1, "{what}: used length");
                self.model.forget(off, p.data_len());
            }
            _ => assert_eq!(
                used_len, 1,
                "{what}: used length of a request without data read"
            ),
        }
    }
}
