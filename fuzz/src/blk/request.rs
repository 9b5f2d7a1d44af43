//! Building requests: the driver model puts one request (with at most one deliberate mistake)
//! on the queue, its data split over descriptors.

use super::*;

impl Run {
    /// Build one request and make it available (not yet published).
    pub(super) fn request(&mut self, inp: &mut Input) {
        let kind = Kind::from_sel(inp.u8(), inp.u32());
        let sel = inp.u8();
        let mistake = Mistake::from_sel(sel, inp.u8());
        let sector = self.sector(inp);
        // Data buffers (lengths), before placement.
        let mut lens: Vec<u32> = Vec::new();
        let mut segments = Vec::new();
        let mut payload: Vec<u8> = Vec::new();
        match kind {
            Kind::In | Kind::Out | Kind::Other(_) | Kind::Flush => {
                let nsec = u32::from(inp.u8() % 9);
                let mut total = nsec * SECTOR as u32;
                if inp.u8() >= 240 {
                    total += 1 + u32::from(inp.u8()); // not a whole number of sectors
                }
                if kind == Kind::Flush && inp.u8() >= 32 {
                    total = 0;
                }
                split(inp, total, &mut lens);
            }
            Kind::GetId => {
                let n = 1 + inp.u8() % 4;
                let n = if n > 2 { 1 } else { n }; // mostly one buffer, sometimes two or none
                let n = if inp.u8() >= 248 { 0 } else { n };
                for _ in 0..n {
                    lens.push(u32::from(inp.u8() % 40));
                }
            }
            Kind::Discard | Kind::WriteZeroes => {
                let b = inp.u8();
                let nseg = match b {
                    0..=239 => 1 + u32::from(b % 4),
                    240..=247 => MAX_DISCARD_SEG + 1,
                    _ => 0,
                };
                let cap = self.model.capacity() / SECTOR;
                for _ in 0..nseg {
                    let s = match inp.u8() % 4 {
                        0..=2 => u64::from(inp.u8()) % (cap + 1),
                        _ => self.sector(inp),
                    };
                    let num = match inp.u8() {
                        0..=239 => u32::from(inp.u8() % 9),
                        240..=247 => MAX_DISCARD_SECTORS + 1,
                        _ => inp.u32(),
                    };
                    let flags = match inp.u8() {
                        0..=191 => 0,
                        192..=239 => 1,
                        _ => inp.u32(),
                    };
                    segments.push((s, num, flags));
                    payload.extend_from_slice(&s.to_le_bytes());
                    payload.extend_from_slice(&num.to_le_bytes());
                    payload.extend_from_slice(&flags.to_le_bytes());
                }
                if inp.u8() >= 248 {
                    payload.push(0); // not a whole number of segments
                }
                split(inp, payload.len() as u32, &mut lens);
            }
        }
        let status_shared = kind.device_writes_data() && !lens.is_empty() && inp.u8() & 1 == 1;
        let hdr_len = match mistake {
            Mistake::HeaderShort(n) => n,
            _ if inp.u8() >= 240 => 16 + u32::from(inp.u8() % 48),
            _ => 16,
        };
        let ndesc = 1 + lens.len() + usize::from(!status_shared);
        let Some(slots) = self.q.peek_slots(ndesc) else {
            return; // queue full: a driver would wait
        };
        let area = |i: usize| slot_area(self.q.index, slots[i]);
        // Header.
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&kind.code().to_le_bytes());
        hdr[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem
            .write_slice(&hdr, GuestAddress(area(0)))
            .expect("slot area");
        let mut bufs = vec![Buf {
            addr: area(0),
            len: hdr_len,
            write: mistake == Mistake::HeaderWritable,
        }];
        // Data.
        let mut data = Vec::new();
        let mut out_data = Vec::new();
        let mut payload_off = 0usize;
        for (i, &len) in lens.iter().enumerate() {
            let addr = area(1 + i);
            let last = i + 1 == lens.len();
            let write = kind.device_writes_data();
            if write {
                self.mem
                    .write_slice(&vec![0xa5; len as usize], GuestAddress(addr))
                    .expect("slot area");
            } else {
                let bytes = if matches!(kind, Kind::Discard | Kind::WriteZeroes) {
                    payload[payload_off..payload_off + len as usize].to_vec()
                } else {
                    self.salt += 1;
                    write_pattern(len as usize, sector as u8, self.salt)
                };
                payload_off += len as usize;
                self.mem
                    .write_slice(&bytes, GuestAddress(addr))
                    .expect("slot area");
                out_data.extend_from_slice(&bytes);
            }
            let mut b = Buf { addr, len, write };
            if last && status_shared {
                b.len += 1;
            }
            bufs.push(b);
            data.push(Buf { addr, len, write });
        }
        // Status.
        if status_shared && data.last().is_some_and(|b| b.len == 0) {
            data.pop(); // a 1-byte descriptor is only the status byte
        }
        let status_addr = if status_shared {
            let last = bufs.last().expect("data buffer");
            last.addr + u64::from(last.len) - 1
        } else {
            let addr = area(ndesc - 1);
            bufs.push(Buf {
                addr,
                len: 1,
                write: true,
            });
            addr
        };
        // Apply the mistake.
        let mut mistake = mistake;
        match mistake {
            Mistake::WrongDirection => {
                // Only buffers strictly between the header and the status descriptor.
                let n = bufs.len() - 2;
                if n == 0 {
                    mistake = Mistake::None;
                } else {
                    let i = 1 + usize::from(inp.u8()) % n;
                    bufs[i].write = !bufs[i].write;
                }
            }
            Mistake::DataOutside(sel) => {
                let n = bufs.len() - 2;
                let i = 1 + usize::from(inp.u8()) % n.max(1);
                if n == 0 || bufs[i].len == 0 {
                    mistake = Mistake::None;
                } else {
                    let addr = bad_address(sel, bufs[i].len);
                    // Where the moved buffer is guest memory after all, give it the same bytes.
                    let mut content = vec![0u8; bufs[i].len as usize];
                    self.mem
                        .read_slice(&mut content, GuestAddress(bufs[i].addr))
                        .expect("slot area");
                    let _ = self.mem.write_slice(&content, GuestAddress(addr));
                    bufs[i].addr = addr;
                    data[i - 1].addr = addr;
                }
            }
            Mistake::StatusReadOnly => {
                bufs.last_mut().expect("status").write = false;
            }
            Mistake::StatusOutside => {
                let last = bufs.last_mut().expect("status");
                last.addr = crate::driver::HOLE + 0x800;
            }
            _ => {}
        }
        if !matches!(mistake, Mistake::StatusOutside) {
            self.mem
                .write_obj(0xeeu8, GuestAddress(status_addr))
                .expect("status byte");
        }
        let Some(head) = self.q.add_chain(&self.mem, &bufs) else {
            return;
        };
        self.order.push_back(head);
        self.pending.insert(
            head,
            Pending {
                kind,
                sector,
                data,
                out_data,
                segments,
                payload_len: payload.len() as u64,
                status_addr,
                mistake,
            },
        );
    }
}

/// Split `total` bytes over 1..=4 buffers that fit a slot (more when needed); `total`
/// 0 gives no buffer or, sometimes, one empty buffer.
fn split(inp: &mut Input, total: u32, lens: &mut Vec<u32>) {
    if total == 0 {
        if inp.u8() >= 224 {
            lens.push(0);
        }
        return;
    }
    let want = 1 + u32::from(inp.u8() % 4);
    let mut left = total;
    let mut parts = want;
    while left > 0 {
        // One byte short of a slot: the status byte may follow the last buffer.
        let max = (SLOT as u32 - 1).min(left);
        let n = if parts <= 1 {
            max
        } else {
            let cut = 1 + (inp.u16() as u32 % max);
            cut.min(max)
        };
        lens.push(n);
        left -= n;
        parts = parts.saturating_sub(1);
    }
}
