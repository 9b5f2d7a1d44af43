//! Seed inputs: meaningful operation sequences for each target, encoded in the layout the
//! target reads (see [`crate::input`]). `cargo run --features seeds --bin seeds` writes them to
//! `corpus/<target>/seed-*`; libFuzzer starts from them and `cargo fuzz cmin` keeps those that
//! still add coverage.

use crate::input::Seed;

/// `(target, name, bytes)` for every seed.
pub fn all() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut v = Vec::new();
    for (name, bytes) in blk(false) {
        v.push(("blk_raw", name, bytes));
    }
    for (name, bytes) in blk(true) {
        v.push(("blk_overlay", name, bytes));
    }
    for (name, bytes) in mmio() {
        v.push(("mmio_transport", name, bytes));
    }
    for (name, bytes) in net() {
        v.push(("net_rxtx", name, bytes));
    }
    for (name, bytes) in dhcp() {
        v.push(("dhcp_parse", name, bytes));
    }
    for (name, bytes) in vmi() {
        v.push(("vmi_document", name, bytes));
    }
    for (name, bytes) in snapshot() {
        v.push(("snapshot_state", name, bytes));
    }
    for (name, bytes) in crate::bootdisk::cfg_seeds() {
        v.push(("bootcfg", name, bytes));
    }
    v
}

/// `snapshot_state` inputs: mode, TSC delta, then a payload (mode 1) or a whole file (mode 0).
fn snapshot() -> Vec<(String, Vec<u8>)> {
    let input = |mode: u8, body: &[u8]| {
        let mut s = Seed::new();
        s.u8(mode).u64(1_000_000);
        let mut v = s.0;
        v.extend_from_slice(body);
        v
    };
    let json = |overlay| {
        serde_json::to_vec(&crate::snapshot::sample_state(overlay)).expect("state serializes")
    };
    let file = vmm::snapshot::format::encode(&json(false));
    let mut tampered = crate::snapshot::sample_state(false);
    // Rings moved outside guest memory and a queue that claims work it does not have.
    if let Some(d) = tampered.devices.virtio.first_mut() {
        d.transport.queues[0].used_ring = 0xffff_ffff_0000;
    }
    if let Some(d) = tampered.devices.virtio.get_mut(1) {
        d.transport.queues[1].next_avail = 7;
    }
    vec![
        ("payload".into(), input(1, &json(false))),
        ("payload-overlay".into(), input(1, &json(true))),
        ("file".into(), input(0, &file)),
        (
            "payload-tampered".into(),
            input(1, &serde_json::to_vec(&tampered).expect("state serializes")),
        ),
        ("file-truncated".into(), input(0, &file[..file.len() / 2])),
    ]
}

/// Builds `mmio_transport` inputs.
struct MmioSeed(Seed);

/// Register indices in `mmio::REGS`.
mod reg {
    pub const MAGIC: u8 = 0;
    pub const DEVICE_FEATURES: u8 = 4;
    pub const QUEUE_NUM_MAX: u8 = 9;
    pub const QUEUE_READY: u8 = 11;
    pub const INTERRUPT_STATUS: u8 = 13;
    pub const INTERRUPT_ACK: u8 = 14;
    pub const STATUS: u8 = 15;
    pub const CONFIG: u8 = 26;
}

impl MmioSeed {
    fn new(net: bool, mac: bool) -> Self {
        let mut s = Seed::new();
        s.u8(u8::from(net) | if mac { 0x20 } else { 0 } | 0x1c)
            .u8(0)
            .u16(0);
        Self(s)
    }
    fn read(&mut self, reg: u8, width_sel: u8) -> &mut Self {
        self.0.u8(0).u8(0).u8(reg).u8(width_sel);
        self
    }
    fn write_raw(&mut self, reg: u8, v: u32) -> &mut Self {
        self.0.u8(5).u8(0).u8(reg).u8(0).u8(224).u32(v);
        self
    }
    fn init(&mut self, qshift: u8) -> &mut Self {
        self.0.u8(11).u8(7).u8(qshift);
        self
    }
    fn process(&mut self) -> &mut Self {
        self.0.u8(12);
        self
    }
    fn mem(&mut self, addr: u16, bytes: &[u8]) -> &mut Self {
        self.0
            .u8(14)
            .u8(0)
            .u16(addr)
            .u8(bytes.len() as u8)
            .bytes(bytes);
        self
    }
    fn snapshot_restore(&mut self) -> &mut Self {
        self.0.u8(16);
        self
    }
    fn frame(&mut self, len: u16) -> &mut Self {
        self.0.u8(15).u16(len);
        for i in 0..len {
            self.0.u8(i as u8);
        }
        self
    }
}

fn desc(addr: u64, len: u32, flags: u16, next: u16) -> Vec<u8> {
    let mut d = addr.to_le_bytes().to_vec();
    d.extend_from_slice(&len.to_le_bytes());
    d.extend_from_slice(&flags.to_le_bytes());
    d.extend_from_slice(&next.to_le_bytes());
    d
}

fn mmio() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    // virtio-blk: initialise, one read request (header, 512-byte buffer, status), process.
    let mut s = MmioSeed::new(false, false);
    let mut table = desc(0x3000, 16, 1, 1);
    table.extend(desc(0x3100, 512, 3, 2));
    table.extend(desc(0x3400, 1, 2, 0));
    s.init(3)
        .mem(0, &table)
        .mem(0x1000, &[0, 0, 1, 0, 0, 0])
        .snapshot_restore()
        .process()
        .read(reg::INTERRUPT_STATUS, 0)
        .snapshot_restore()
        .write_raw(reg::INTERRUPT_ACK, 1)
        .read(reg::STATUS, 0)
        .read(reg::CONFIG, 0)
        .write_raw(reg::STATUS, 0)
        .read(reg::QUEUE_READY, 0);
    v.push(("blk-request".to_string(), s.0.into_bytes()));
    // virtio-net: initialise, a frame from the host, one receive buffer, one frame to send.
    let mut s = MmioSeed::new(true, true);
    s.init(2)
        .frame(80)
        .mem(0, &desc(0x8000, 2048, 2, 0))
        .mem(0x1000, &[0, 0, 1, 0, 0, 0])
        .mem(0x4000, &desc(0x9000, 60, 0, 0))
        .mem(0x5000, &[0, 0, 1, 0, 0, 0])
        .process()
        .read(reg::INTERRUPT_STATUS, 0)
        .read(reg::CONFIG, 0);
    v.push(("net-rx-tx".to_string(), s.0.into_bytes()));
    // Register soup: identification, narrow and wide accesses, out-of-order status writes.
    let mut s = MmioSeed::new(false, false);
    s.read(reg::MAGIC, 0)
        .read(reg::MAGIC, 5)
        .read(reg::DEVICE_FEATURES, 7)
        .read(reg::QUEUE_NUM_MAX, 0)
        .write_raw(reg::STATUS, 4)
        .write_raw(reg::STATUS, 1)
        .write_raw(reg::STATUS, 0x83)
        .init(1)
        .write_raw(reg::STATUS, 0x4f);
    v.push(("registers".to_string(), s.0.into_bytes()));
    v
}

fn net() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    let send = |s: &mut Seed, len: u16| {
        s.u8(0).u8(32).u16(len - 12).bytes(&[0; 12]);
    };
    let rx = |s: &mut Seed| {
        s.u8(2).u8(0).u8(0).u8(4).u8(0);
    };
    let tx = |s: &mut Seed, len: u16| {
        s.u8(5)
            .u8(2)
            .u16(len - 12)
            .u8(0)
            .bytes(&[0; 12])
            .u8(0)
            .u8(0);
    };
    let mut s = Seed::new();
    s.u8(7).u8(1).u8(1).u32(u32::MAX);
    send(&mut s, 100);
    send(&mut s, 1514);
    rx(&mut s);
    s.u8(4);
    rx(&mut s);
    rx(&mut s);
    s.u8(4);
    tx(&mut s, 60);
    tx(&mut s, 1000);
    s.u8(7);
    v.push(("rx-tx".to_string(), s.into_bytes()));
    // Frames wait for buffers, then a reset drops the waiting one.
    let mut s = Seed::new();
    s.u8(0).u8(0).u8(0).u32(0);
    send(&mut s, 200);
    send(&mut s, 300);
    s.u8(4).u8(8);
    rx(&mut s);
    s.u8(4);
    v.push(("backpressure-reset".to_string(), s.into_bytes()));
    v
}

fn dhcp() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    // Structured request: default lease, header fields, options, END.
    let req = |opts: &[&[u8]], ciaddr_sel: u8| {
        let mut s = Seed::new();
        s.u8(0)
            .u8(1)
            .u8(0)
            .u8(0)
            .u32(0x1234_5678)
            .u8(0)
            .u8(ciaddr_sel)
            .u8(1)
            .u8(1);
        s.u8(opts.len() as u8);
        for o in opts {
            s.bytes(o);
        }
        s.u8(0);
        s.into_bytes()
    };
    const DISCOVER: &[u8] = &[0, 0];
    const REQUEST: &[u8] = &[0, 1];
    const INFORM: &[u8] = &[0, 2];
    const RELEASE: &[u8] = &[0, 7];
    const WANT_LEASE_IP: &[u8] = &[3, 1];
    const WANT_OTHER_IP: &[u8] = &[3, 0, 1, 2, 3, 4];
    const OUR_SERVER: &[u8] = &[4, 1];
    v.push(("discover".into(), req(&[DISCOVER], 0)));
    v.push((
        "request-ack".into(),
        req(&[REQUEST, WANT_LEASE_IP, OUR_SERVER], 0),
    ));
    v.push(("request-nak".into(), req(&[REQUEST, WANT_OTHER_IP], 0)));
    v.push(("renew-ciaddr".into(), req(&[REQUEST], 2)));
    v.push(("inform".into(), req(&[INFORM], 2)));
    v.push(("release".into(), req(&[RELEASE], 2)));
    // A lease with long search list, many DNS servers and routes (options split per RFC 3396).
    let mut s = Seed::new();
    s.u8(0x0f).u32(0x0a00_0202).u8(24).u32(0x0a00_0201).u8(70);
    for i in 0..70u32 {
        s.u32(0x0a60_0000 + i);
    }
    s.u8(4);
    for _ in 0..4 {
        s.u8(110).bytes(&[7u8; 110]);
    }
    s.u8(20).bytes(b"vmi-host-name-01234.").u16(1450).u32(3600);
    s.u8(40);
    for i in 0..40u32 {
        s.u32(0x0a00_0000 + (i << 8))
            .u8((i % 33) as u8)
            .u32(0x0a00_0201);
    }
    s.bytes(&req(&[DISCOVER], 0)[1..]);
    v.push(("big-lease".into(), s.into_bytes()));
    v
}

fn vmi() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for name in ["demo-vmi.yaml", "linux-vmi.yaml"] {
        if let Ok(text) = std::fs::read(examples.join(name)) {
            let mut b = vec![0u8];
            b.extend_from_slice(&text);
            v.push((format!("raw-{name}"), b));
        }
    }
    let mut b = vec![0u8];
    b.extend_from_slice(
        br#"{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstance","metadata":{"name":"a","namespace":"ns","uid":"u"},"spec":{"domain":{"cpu":{"cores":2},"memory":{"guest":"1Gi"},"devices":{"disks":[{"name":"root","disk":{"bus":"virtio"}}],"interfaces":[{"name":"default","masquerade":{},"ports":[{"port":80}]}]}},"volumes":[{"name":"root","containerDisk":{"image":"x"}},{"name":"e","emptyDisk":{"capacity":"1Gi"}}],"networks":[{"name":"default","pod":{}}]},"guestMemoryBytes":1073741824,"vcpus":2}"#,
    );
    v.push(("raw-operator-document".into(), b));
    for (mode, name) in [(1u8, "block"), (5, "flow"), (7, "json-as-yaml")] {
        let mut b = vec![mode];
        b.extend((0..200u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
        v.push((format!("generated-{name}"), b));
    }
    v
}

/// Builds `blk_raw` / `blk_overlay` inputs.
pub struct BlkSeed(Seed);

impl BlkSeed {
    /// A disk of `sectors` (1..=96) whole sectors, read-only or not (raw only), on tmpfs or the
    /// temporary directory, with a queue of `4 << qshift` entries.
    pub fn new(ro: bool, sectors: u8, tmp: bool, qshift: u8) -> Self {
        let mut s = Seed::new();
        s.u8(u8::from(ro) | (u8::from(tmp) << 2))
            .u8(sectors - 1)
            .u8(0x3c)
            .u8(qshift);
        Self(s)
    }

    fn sector(&mut self, sector: u8) -> &mut Self {
        self.0.u8(0).u8(sector);
        self
    }

    fn header(&mut self, kind: u8) -> &mut Self {
        self.0.u8(0).u8(kind).u32(0).u8(0).u8(0);
        self
    }

    /// Read or write (`kind` 0 / 1) `nsec` sectors at `sector`, split over `parts` buffers.
    pub fn rw(&mut self, write: bool, sector: u8, nsec: u8, parts: u8) -> &mut Self {
        self.header(u8::from(write)).sector(sector);
        self.0.u8(nsec).u8(0);
        if nsec == 0 {
            self.0.u8(0);
        } else {
            self.0.u8(parts - 1);
            for i in 1..parts {
                self.0.u16(100 * u16::from(i));
            }
        }
        if !write && nsec > 0 {
            self.0.u8(0); // status in its own descriptor
        }
        self.0.u8(0); // 16-byte header
        self
    }

    pub fn flush(&mut self) -> &mut Self {
        self.header(2).sector(0);
        self.0.u8(0).u8(0).u8(200).u8(0).u8(0);
        self
    }

    pub fn get_id(&mut self, len: u8) -> &mut Self {
        self.header(3).sector(0);
        self.0.u8(0).u8(0).u8(len).u8(1).u8(0);
        self
    }

    /// Discard (or write zeroes) with segments `(sector, sectors, unmap)`.
    pub fn discard(&mut self, zeroes: bool, segs: &[(u8, u8, bool)]) -> &mut Self {
        self.header(if zeroes { 5 } else { 4 }).sector(0);
        self.0.u8(segs.len() as u8 - 1);
        for &(s, n, unmap) in segs {
            self.0
                .u8(0)
                .u8(s)
                .u8(0)
                .u8(n)
                .u8(if unmap { 200 } else { 0 });
        }
        self.0.u8(0).u8(0).u8(0);
        self
    }

    pub fn kick(&mut self) -> &mut Self {
        self.0.u8(3);
        self
    }

    pub fn reset(&mut self) -> &mut Self {
        self.0.u8(5);
        self
    }

    pub fn reopen(&mut self) -> &mut Self {
        self.0.u8(6);
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.0 .0.clone()
    }
}

fn blk(overlay: bool) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    let mut s = BlkSeed::new(false, 64, false, 3);
    s.rw(true, 3, 2, 2)
        .kick()
        .rw(false, 2, 4, 3)
        .kick()
        .flush()
        .get_id(20)
        .kick();
    v.push(("write-read".to_string(), s.bytes()));
    let mut s = BlkSeed::new(false, 16, true, 3);
    s.rw(true, 0, 8, 1)
        .discard(false, &[(1, 2, false), (6, 1, false)])
        .discard(true, &[(4, 1, true)])
        .rw(false, 0, 8, 4)
        .kick()
        .reopen()
        .rw(false, 0, 8, 2)
        .kick();
    v.push(("discard-zeroes-reopen".to_string(), s.bytes()));
    let mut s = BlkSeed::new(false, 8, false, 3);
    s.rw(false, 7, 2, 1)
        .rw(true, 8, 1, 1)
        .rw(false, 8, 0, 1)
        .kick()
        .reset()
        .get_id(5)
        .kick();
    v.push(("edges-reset".to_string(), s.bytes()));
    if !overlay {
        let mut s = BlkSeed::new(true, 8, false, 3);
        s.rw(true, 0, 1, 1)
            .rw(false, 0, 1, 1)
            .discard(false, &[(0, 1, false)])
            .kick();
        v.push(("read-only".to_string(), s.bytes()));
    }
    v
}
