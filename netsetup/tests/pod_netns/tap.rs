//! DHCP through the real TAP as the VMM sees it: frames with their virtio-net headers.

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use netsetup::{Binding, InterfaceSpec};

use crate::fixture::{resolv, setup, Fixture, GUEST_MAC};
use crate::relay::attach_tap;

/// The virtio-net header the TAP prepends with IFF_VNET_HDR (default size, 10 bytes).
pub(crate) const VNET_HDR: usize = 10;

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A broadcast DHCP request frame from `mac`, as a guest's DHCP client sends it.
fn dhcp_frame(mac: [u8; 6], xid: [u8; 4], msg_type: u8, opts: &[(u8, &[u8])]) -> Vec<u8> {
    let mut dhcp = vec![0u8; 240];
    dhcp[0] = 1;
    dhcp[1] = 1;
    dhcp[2] = 6;
    dhcp[4..8].copy_from_slice(&xid);
    dhcp[10] = 0x80; // broadcast flag
    dhcp[28..34].copy_from_slice(&mac);
    dhcp[236..240].copy_from_slice(&[99, 130, 83, 99]);
    dhcp.extend_from_slice(&[53, 1, msg_type]);
    for (c, v) in opts {
        dhcp.push(*c);
        dhcp.push(v.len() as u8);
        dhcp.extend_from_slice(v);
    }
    dhcp.push(255);
    dhcp.resize(300, 0);
    let udp_len = (8 + dhcp.len()) as u16;
    let mut udp = Vec::new();
    udp.extend_from_slice(&68u16.to_be_bytes());
    udp.extend_from_slice(&67u16.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]); // no UDP checksum (allowed for IPv4)
    udp.extend_from_slice(&dhcp);
    let mut iph = vec![
        0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255,
    ];
    iph[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    let c = checksum(&iph);
    iph[10..12].copy_from_slice(&c.to_be_bytes());
    let mut frame = vec![0u8; VNET_HDR];
    frame.extend_from_slice(&[0xff; 6]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&iph);
    frame.extend_from_slice(&udp);
    frame
}

/// Reads frames from the TAP until a DHCP reply with `xid` arrives (at most `wait`); returns
/// (message type, yiaddr).
fn read_dhcp_reply(
    tap: &mut std::fs::File,
    xid: [u8; 4],
    wait: Duration,
) -> Result<(u8, Ipv4Addr)> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd: tap.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, 200) };
        if r <= 0 {
            continue;
        }
        let n = tap.read(&mut buf)?;
        let f = &buf[VNET_HDR.min(n)..n];
        // Ethernet + IPv4 (IHL 5) + UDP to port 68.
        if f.len() < 14 + 20 + 8 + 240 || f[12..14] != [0x08, 0x00] || f[14 + 9] != 17 {
            continue;
        }
        let udp = &f[34..];
        if udp[2..4] != 68u16.to_be_bytes() {
            continue;
        }
        let d = &udp[8..];
        if d[0] != 2 || d[4..8] != xid {
            continue;
        }
        let yiaddr = Ipv4Addr::new(d[16], d[17], d[18], d[19]);
        let mut i = 240;
        while i + 2 < d.len() && d[i] != 255 {
            if d[i] == 0 {
                i += 1;
                continue;
            }
            if d[i] == 53 {
                return Ok((d[i + 2], yiaddr));
            }
            i += 2 + usize::from(d[i + 1]);
        }
    }
    bail!("no DHCP reply on the TAP")
}

#[test]
fn dhcp_through_the_tap_as_the_vmm_sees_it() -> Result<()> {
    let fx = Fixture::new("tap")?;
    let mac: netsetup::MacAddr = GUEST_MAC.parse()?;
    let spec = InterfaceSpec {
        mac: Some(mac),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Masquerade, spec)?;
    let mut tap = fx.in_ns(&fx.pod, || attach_tap(net.tap_name()))??;
    let xid = [0xde, 0xad, 0xbe, 0xef];
    // The bridge port may take a moment to come up after attaching: resend DISCOVER.
    let mut offer = None;
    for _ in 0..5 {
        tap.write_all(&dhcp_frame(mac.0, xid, 1, &[]))?;
        if let Ok(r) = read_dhcp_reply(&mut tap, xid, Duration::from_secs(2)) {
            offer = Some(r);
            break;
        }
    }
    assert_eq!(offer, Some((2, Ipv4Addr::new(10, 0, 2, 2))), "OFFER");
    tap.write_all(&dhcp_frame(
        mac.0,
        xid,
        3,
        &[(50, &[10, 0, 2, 2]), (54, &[10, 0, 2, 1])],
    ))?;
    assert_eq!(
        read_dhcp_reply(&mut tap, xid, Duration::from_secs(5))?,
        (5, Ipv4Addr::new(10, 0, 2, 2)),
        "ACK"
    );
    // Another MAC gets nothing.
    let other = [0x02, 0, 0, 0, 0, 0x99];
    tap.write_all(&dhcp_frame(other, [1, 1, 1, 1], 1, &[]))?;
    assert!(read_dhcp_reply(&mut tap, [1, 1, 1, 1], Duration::from_secs(1)).is_err());
    drop(tap);
    net.teardown()?;
    Ok(())
}
