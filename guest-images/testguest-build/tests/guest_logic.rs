//! Host unit tests of the test guest's pure parsing code (`testguest/src/parse.rs`, compiled
//! here as an ordinary module: it uses only `core`).

#[path = "../../testguest/src/parse.rs"]
mod parse;

use parse::*;

#[test]
fn cmdline_params() {
    let c = b"console=ttyS0 testguest.scenario=echo  virtio_mmio.device=4K@0xc0001000:5\tvirtio_mmio.device=4K@0xc0002000:6 testguest.scenario2=x";
    assert_eq!(
        params(c, "testguest.scenario").collect::<Vec<_>>(),
        vec![&b"echo"[..]]
    );
    assert_eq!(params(c, "virtio_mmio.device").count(), 2);
    assert_eq!(params(c, "missing").count(), 0);
    assert_eq!(params(b"", "x").count(), 0);
    assert_eq!(params(b"x", "x").count(), 0, "a bare key has no value");
    assert_eq!(params(b"x=", "x").collect::<Vec<_>>(), vec![&b""[..]]);
}

#[test]
fn numbers_and_sizes() {
    assert_eq!(parse_num(b"0"), Some(0));
    assert_eq!(parse_num(b"123"), Some(123));
    assert_eq!(parse_num(b"0xc0001000"), Some(0xc000_1000));
    assert_eq!(parse_num(b"0XfF"), Some(255));
    assert_eq!(parse_num(b"18446744073709551615"), Some(u64::MAX));
    for bad in [
        &b""[..],
        b"0x",
        b"12a",
        b"-1",
        b"18446744073709551616",
        b"0x10000000000000000",
        b" 1",
    ] {
        assert_eq!(parse_num(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
    assert_eq!(parse_size(b"4K"), Some(4096));
    assert_eq!(parse_size(b"1m"), Some(1 << 20));
    assert_eq!(parse_size(b"0x1000"), Some(4096));
    assert_eq!(parse_size(b"K"), None);
    assert_eq!(parse_size(b""), None);
    assert_eq!(parse_size(b"0xffffffffffffffffK"), None, "overflow");
}

#[test]
fn virtio_mmio_device_values() {
    assert_eq!(
        parse_virtio_mmio(b"4K@0xc0001000:5"),
        Some((4096, 0xc000_1000, Some(5)))
    );
    assert_eq!(
        parse_virtio_mmio(b"0x1000@3221229568"),
        Some((4096, 0xc000_1000, None))
    );
    assert_eq!(parse_virtio_mmio(b"4K@0xc0001000:x"), None);
    assert_eq!(parse_virtio_mmio(b"4K0xc0001000:5"), None);
    assert_eq!(parse_virtio_mmio(b"@:"), None);
}

#[test]
fn trailing_numbers_in_payloads() {
    assert_eq!(trailing_number(b"microvirt pong 7"), Some(7));
    assert_eq!(trailing_number(b"microvirt seq 12\0\0\0\0"), Some(12));
    assert_eq!(trailing_number(b"microvirt seq"), None);
    assert_eq!(trailing_number(b"microvirt seq x1"), None);
    assert_eq!(trailing_number(b"microvirt seq "), None);
    assert_eq!(trailing_number(b""), None);
}

#[test]
fn stream_frame_numbers() {
    assert_eq!(
        two_numbers(b"microvirt ack 12 3\0\0", b"microvirt ack "),
        Some((12, 3))
    );
    assert_eq!(
        two_numbers(b"microvirt ack 0 0", b"microvirt ack "),
        Some((0, 0))
    );
    assert_eq!(two_numbers(b"microvirt ack 12", b"microvirt ack "), None);
    assert_eq!(two_numbers(b"microvirt ack x 1", b"microvirt ack "), None);
    assert_eq!(two_numbers(b"microvirt ack 1 2x", b"microvirt ack "), None);
    assert_eq!(two_numbers(b"microvirt pong 1 2", b"microvirt ack "), None);
}

fn feed(bytes: &[u8]) -> Option<usize> {
    let mut d = CtrlAltDel::default();
    bytes.iter().position(|&b| d.feed(b))
}

#[test]
fn ctrl_alt_del_in_both_scancode_sets() {
    // Set 2 as the VMM's i8042 sends it (presses, then releases).
    let set2 = [
        0x14, 0x11, 0xe0, 0x71, 0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14,
    ];
    assert_eq!(feed(&set2), Some(3));
    // Set 1.
    assert_eq!(
        feed(&[0x1d, 0x38, 0xe0, 0x53, 0xe0, 0xd3, 0xb8, 0x9d]),
        Some(3)
    );
    // Keypad Del works too; order of Ctrl and Alt does not matter.
    assert_eq!(feed(&[0x11, 0x14, 0x71]), Some(2));
    // Released modifiers do not count.
    assert_eq!(feed(&[0x14, 0xf0, 0x14, 0x11, 0xe0, 0x71]), None);
    assert_eq!(feed(&[0x1d, 0x9d, 0x38, 0xe0, 0x53]), None);
    // Del alone, or other keys, never trigger.
    assert_eq!(feed(&[0xe0, 0x71, 0xe0, 0x53, 0x1c, 0x9c]), None);
    assert_eq!(feed(&[]), None);
}

#[path = "../../testguest/src/packet.rs"]
mod packet;

mod packets {
    use super::packet::*;

    const MAC: [u8; 6] = [2, 0, 0, 0xaa, 0xbb, 0xcc];
    const PEER: [u8; 6] = [2, 0, 0, 1, 2, 3];
    const IP: [u8; 4] = [10, 0, 2, 2];
    const PEER_IP: [u8; 4] = [10, 0, 2, 1];

    fn ip_frame(proto: u8, src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&MAC);
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&[8, 0]);
        let total = (20 + payload.len()) as u16;
        let mut h = vec![0x45, 0];
        h.extend_from_slice(&total.to_be_bytes());
        h.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        let c = checksum(&h, 0);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&h);
        f.extend_from_slice(payload);
        f
    }

    fn ping(seq: u16, data: &[u8]) -> Vec<u8> {
        let mut p = vec![8, 0, 0, 0, 0x12, 0x34];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(data);
        let c = checksum(&p, 0);
        p[2..4].copy_from_slice(&c.to_be_bytes());
        ip_frame(IPPROTO_ICMP, PEER_IP, IP, &p)
    }

    fn udp(dport: u16, data: &[u8]) -> Vec<u8> {
        let mut u = vec![0x9c, 0x40];
        u.extend_from_slice(&dport.to_be_bytes());
        u.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(data);
        ip_frame(IPPROTO_UDP, PEER_IP, IP, &u)
    }

    fn arp_request(target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&PEER);
        f.extend_from_slice(&PEER_IP);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f
    }

    fn answer(frame: &[u8]) -> Option<(Vec<u8>, Answer)> {
        let mut out = vec![0u8; MAX_FRAME];
        respond(frame, MAC, IP, 7, &mut out).map(|(n, a)| (out[..n].to_vec(), a))
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 section 3: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2; checksum = !ddf2.
        assert_eq!(
            checksum(&[0, 1, 0xf2, 3, 0xf4, 0xf5, 0xf6, 0xf7], 0),
            !0xddf2
        );
        assert_eq!(checksum(&[], 0), 0xffff);
        assert_eq!(checksum(&[0xff], 0), !0xff00);
    }

    #[test]
    fn arp_requests_for_our_address_are_answered() {
        let (r, a) = answer(&arp_request(IP)).unwrap();
        assert_eq!(a, Answer::Arp);
        assert_eq!(r.len(), MIN_FRAME);
        assert_eq!(&r[0..6], &PEER);
        assert_eq!(&r[6..12], &MAC);
        assert_eq!(&r[12..14], &[8, 6]);
        assert_eq!(&r[20..22], &[0, 2], "reply");
        assert_eq!(&r[22..28], &MAC);
        assert_eq!(&r[28..32], &IP);
        assert_eq!(&r[32..38], &PEER);
        assert_eq!(&r[38..42], &PEER_IP);
        assert!(answer(&arp_request([10, 0, 2, 3])).is_none());
        let mut reply = arp_request(IP);
        reply[21] = 2; // an ARP reply is not answered
        assert!(answer(&reply).is_none());
    }

    #[test]
    fn pings_are_echoed_with_valid_checksums() {
        let req = ping(7, b"abcdefgh0123456789");
        let (r, a) = answer(&req).unwrap();
        assert_eq!(a, Answer::Ping);
        assert_eq!(&r[0..6], &PEER);
        assert_eq!(&r[6..12], &MAC);
        assert_eq!(checksum(&r[14..34], 0), 0, "IP header checksum");
        assert_eq!(&r[26..30], &IP);
        assert_eq!(&r[30..34], &PEER_IP);
        let icmp = &r[34..34 + req.len() - 34];
        assert_eq!(icmp[0], 0, "echo reply");
        assert_eq!(checksum(icmp, 0), 0, "ICMP checksum");
        assert_eq!(&icmp[4..], &req[38..], "id, sequence and data echoed");
        // A corrupt ICMP checksum, another destination, a fragment: no answer.
        let mut bad = req.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(answer(&bad).is_none());
        let other = ip_frame(IPPROTO_ICMP, PEER_IP, [10, 0, 2, 9], &req[34..]);
        assert!(answer(&other).is_none());
        let mut frag = req.clone();
        frag[20] |= 0x20; // MF
        let c = {
            frag[24..26].copy_from_slice(&[0, 0]);
            checksum(&frag[14..34], 0)
        };
        frag[24..26].copy_from_slice(&c.to_be_bytes());
        assert!(answer(&frag).is_none());
    }

    #[test]
    fn udp_to_the_echo_port_is_echoed() {
        let req = udp(7, b"hello microvirt");
        let (r, a) = answer(&req).unwrap();
        assert_eq!(a, Answer::UdpEcho);
        assert_eq!(&r[34..36], &[0, 7], "source port = the echo port");
        assert_eq!(&r[36..38], &[0x9c, 0x40], "to the sender's port");
        assert_eq!(&r[42..42 + 15], b"hello microvirt");
        assert_eq!(checksum(&r[14..34], 0), 0);
        assert!(answer(&udp(8, b"x")).is_none(), "other ports are dropped");
        // Frames for another MAC are not ours.
        let mut other = req.clone();
        other[0] = 0x42;
        assert!(answer(&other).is_none());
    }

    #[test]
    fn dhcp_discover_and_request_frames() {
        let mut out = vec![0u8; MAX_FRAME];
        let xid = [1, 2, 3, 4];
        let n = dhcp_client_frame(&mut out, MAC, xid, None);
        let f = &out[..n];
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[12..14], &[8, 0]);
        assert_eq!(checksum(&f[14..34], 0), 0);
        assert_eq!(&f[26..30], &[0; 4]);
        assert_eq!(&f[30..34], &[255; 4]);
        assert_eq!(&f[34..38], &[0, 68, 0, 67]);
        let udp_len = u16::from_be_bytes([f[38], f[39]]) as usize;
        assert!(34 + udp_len <= n, "the frame holds the whole datagram");
        let b = &f[42..];
        assert_eq!((b[0], b[1], b[2]), (1, 1, 6));
        assert_eq!(&b[4..8], &xid);
        assert_eq!(&b[28..34], &MAC);
        assert_eq!(&b[236..240], &[99, 130, 83, 99]);
        assert_eq!(&b[240..243], &[53, 1, 1], "DISCOVER");
        let n = dhcp_client_frame(&mut out, MAC, xid, Some(([10, 0, 2, 2], [10, 0, 2, 1])));
        let b = &out[42..n];
        assert_eq!(&b[240..243], &[53, 1, 3], "REQUEST");
        assert_eq!(&b[243..249], &[50, 4, 10, 0, 2, 2]);
        assert_eq!(&b[249..255], &[54, 4, 10, 0, 2, 1]);
    }

    fn dhcp_reply(msg: u8, xid: [u8; 4], yiaddr: [u8; 4]) -> Vec<u8> {
        let mut b = vec![0u8; 236];
        b[0] = 2;
        b[1] = 1;
        b[2] = 6;
        b[4..8].copy_from_slice(&xid);
        b[16..20].copy_from_slice(&yiaddr);
        b[28..34].copy_from_slice(&MAC);
        b.extend_from_slice(&[99, 130, 83, 99, 53, 1, msg, 1, 4, 255, 255, 255, 0]);
        b.extend_from_slice(&[3, 4, 10, 0, 2, 1, 54, 4, 10, 0, 2, 1, 0, 255]);
        let mut u = vec![0, 67, 0, 68];
        u.extend_from_slice(&((8 + b.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(&b);
        let mut f = ip_frame(IPPROTO_UDP, PEER_IP, [255; 4], &u);
        f[0..6].copy_from_slice(&[0xff; 6]);
        f
    }

    #[test]
    fn dhcp_replies_parse() {
        let xid = [9, 9, 9, 9];
        let lease = Lease {
            ip: IP,
            mask: [255, 255, 255, 0],
            router: PEER_IP,
            server: PEER_IP,
        };
        assert_eq!(
            parse_dhcp(&dhcp_reply(2, xid, IP), MAC, xid),
            Some(DhcpReply::Offer(lease))
        );
        assert_eq!(
            parse_dhcp(&dhcp_reply(5, xid, IP), MAC, xid),
            Some(DhcpReply::Ack(lease))
        );
        assert_eq!(
            parse_dhcp(&dhcp_reply(6, xid, [0; 4]), MAC, xid),
            Some(DhcpReply::Nak)
        );
        assert_eq!(
            parse_dhcp(&dhcp_reply(2, [1, 1, 1, 1], IP), MAC, xid),
            None,
            "other xid"
        );
        assert_eq!(
            parse_dhcp(&dhcp_reply(2, xid, IP), PEER, xid),
            None,
            "other client"
        );
        assert_eq!(
            parse_dhcp(&dhcp_reply(2, xid, [0; 4]), MAC, xid),
            None,
            "no address"
        );
    }

    /// Every truncation and many random corruptions of valid frames: no panic, and nothing
    /// is answered that is not addressed to us.
    #[test]
    fn malformed_frames_never_panic() {
        let xid = [9, 9, 9, 9];
        let samples = [
            arp_request(IP),
            ping(1, &[0x55; 100]),
            udp(7, b"payload"),
            dhcp_reply(5, xid, IP),
        ];
        let mut out = vec![0u8; MAX_FRAME];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for s in &samples {
            for cut in 0..=s.len() {
                let _ = respond(&s[..cut], MAC, IP, 7, &mut out);
                let _ = parse_dhcp(&s[..cut], MAC, xid);
            }
            for _ in 0..20_000 {
                let mut f = s.clone();
                for _ in 0..1 + rnd() % 4 {
                    let i = (rnd() as usize) % f.len();
                    f[i] = rnd() as u8;
                }
                if rnd() % 4 == 0 {
                    f.truncate((rnd() as usize) % (f.len() + 1));
                }
                if let Some((n, _)) = respond(&f, MAC, IP, 7, &mut out) {
                    assert!((MIN_FRAME..=MAX_FRAME).contains(&n));
                }
                let _ = parse_dhcp(&f, MAC, xid);
            }
        }
        let big = vec![0xffu8; MAX_FRAME + 1];
        assert!(respond(&big, MAC, IP, 7, &mut out).is_none());
        let mut short_out = vec![0u8; 10];
        assert!(respond(&samples[0], MAC, IP, 7, &mut short_out).is_none());
    }
}

#[test]
fn aml_lengths_and_integers() {
    assert_eq!(aml_pkg_length(&[0x3f]), Some((0x3f, 1)));
    assert_eq!(aml_pkg_length(&[0x45, 0x12]), Some((0x125, 2)));
    assert_eq!(aml_pkg_length(&[0x81, 0x34, 0x12]), Some((0x12341, 3)));
    assert_eq!(aml_pkg_length(&[0x81, 0x34]), None, "truncated");
    assert_eq!(aml_pkg_length(&[]), None);
    assert_eq!(aml_integer(&[0x00]), Some((0, 1)));
    assert_eq!(aml_integer(&[0x01]), Some((1, 1)));
    assert_eq!(aml_integer(&[0x0a, 0x7f]), Some((0x7f, 2)));
    assert_eq!(aml_integer(&[0x0b, 0x34, 0x12]), Some((0x1234, 3)));
    assert_eq!(
        aml_integer(&[0x0c, 0x00, 0xf0, 0x0f, 0x00]),
        Some((0xf_f000, 5))
    );
    assert_eq!(
        aml_integer(&[0x0e, 1, 2, 3, 4, 5, 6, 7, 8]),
        Some((0x0807_0605_0403_0201, 9))
    );
    assert_eq!(aml_integer(&[0x0c, 0x00]), None, "truncated");
    assert_eq!(aml_integer(&[0x0d]), None, "a string is no integer");
}

/// `Device (VGEN) { Name (_HID, "QEMUVGID") Name (_CID, "VM_Gen_Counter")
/// Method (ADDR) { Return (Package { 0xff000, 0 }) } }`, hand-assembled, inside other bytes.
fn vgen_aml(name: &[u8; 4], low: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(name);
    body.extend_from_slice(b"\x08_HID\x0dQEMUVGID\0");
    body.extend_from_slice(b"\x08_CID\x0dVM_Gen_Counter\0");
    let mut pkg = vec![0x02];
    pkg.extend_from_slice(low);
    pkg.push(0x00);
    let mut method = b"ADDR\x00\xa4\x12".to_vec();
    method.push((pkg.len() + 1) as u8);
    method.extend_from_slice(&pkg);
    body.push(0x14);
    body.push((method.len() + 1) as u8);
    body.extend_from_slice(&method);
    let mut out = b"\x10\x05_SB_\x5b\x82\x05PWRB".to_vec();
    out.extend_from_slice(&[0x5b, 0x82, (body.len() + 1) as u8]);
    out.extend_from_slice(&body);
    out.extend_from_slice(b"\x08_S5_\x12\x06\x04\x0a\x05\x00\x00\x00");
    out
}

#[test]
fn aml_vmgenid_device() {
    let aml = vgen_aml(b"VGEN", &[0x0c, 0x00, 0xf0, 0x0f, 0x00]);
    assert_eq!(
        aml_vmgenid(&aml, b"VGEN"),
        Some(VmGenIdDevice {
            hid: true,
            cid: true,
            addr: Some(0xf_f000)
        })
    );
    assert_eq!(aml_vmgenid(&aml, b"NONE"), None);
    assert_eq!(
        aml_vmgenid(&vgen_aml(b"OTHR", &[0x0c, 0, 0xf0, 0x0f, 0]), b"VGEN"),
        None
    );
    // A package element that is not an integer: no address.
    let bad = vgen_aml(b"VGEN", &[0x0d, b'x', 0, 0, 0]);
    assert_eq!(aml_vmgenid(&bad, b"VGEN").unwrap().addr, None);
    // Every truncation is handled without a panic.
    for n in 0..aml.len() {
        let _ = aml_vmgenid(&aml[..n], b"VGEN");
    }
}
