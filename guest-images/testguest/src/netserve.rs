//! `testguest.scenario=net-serve`: a tiny network host for whole-system tests.
//!
//! Gets an address by DHCP on the first virtio-net device (DISCOVER/OFFER/REQUEST/ACK, one
//! try per second), prints `net-serve: ip=<a.b.c.d>/<prefix> router=<r> server=<s>`, then
//! answers, forever: ARP requests for its address, ICMP echo requests (ping) and UDP datagrams
//! to port `testguest.udp_echo_port` (default 7, the echo service) with the same payload.
//! Anything else is dropped (parsing is in `packet.rs`: malformed frames are ignored).
//! Ctrl+Alt+Del (the launcher's graceful shutdown) ends the guest (ACPI power-off, else reset).
//! Without a NIC it prints
//! `net-serve: no device` and waits for Ctrl+Alt+Del just the same.
//!
//! The device is polled: the vCPU stays busy while the guest serves (no interrupts).

use crate::bootinfo::BootInfo;
use crate::io::pause;
use crate::packet::{self, DhcpReply, Lease, MAX_FRAME};
use crate::{i8042, print, println};

const DEFAULT_UDP_ECHO_PORT: u16 = 7;
/// How long one DHCP step waits for an answer.
const DHCP_WAIT_MS: u64 = 1000;
/// How long one receive poll lasts before the keyboard is checked again.
const POLL_MS: u64 = 20;

fn prefix_len(mask: [u8; 4]) -> u32 {
    u32::from_be_bytes(mask).leading_ones()
}

fn print_ip(ip: [u8; 4]) {
    print!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3]);
}

/// Resets on Ctrl+Alt+Del.
fn check_keyboard(dec: &mut i8042::CtrlAltDel) {
    while let Some(b) = i8042::try_read() {
        if dec.feed(b) {
            println!("ctrl-alt-del received");
            crate::finish();
        }
    }
}

pub fn run(bi: &BootInfo) -> ! {
    let mut dec = i8042::CtrlAltDel::default();
    let port = bi
        .param("testguest.udp_echo_port")
        .and_then(crate::parse::parse_num)
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(DEFAULT_UDP_ECHO_PORT);
    let mut net = match crate::net::open(bi) {
        Ok(n) => n,
        Err(e) => {
            println!("net-serve: {}", e);
            loop {
                check_keyboard(&mut dec);
                pause();
            }
        }
    };
    let mac = net.mac;
    let mut rx = [0u8; MAX_FRAME];
    let mut tx = [0u8; MAX_FRAME];
    // A transaction id from the MAC and the TSC.
    let t = crate::io::rdtsc();
    let xid = [mac[4] ^ (t >> 24) as u8, mac[5] ^ (t >> 16) as u8, (t >> 8) as u8, t as u8];

    let lease = dhcp(&mut net, &mut dec, mac, xid, &mut rx, &mut tx);
    print!("net-serve: ip=");
    print_ip(lease.ip);
    print!("/{} router=", prefix_len(lease.mask));
    print_ip(lease.router);
    print!(" server=");
    print_ip(lease.server);
    println!(" udp-echo={}", port);

    loop {
        if let Some(n) = net.recv_raw(POLL_MS, &mut rx) {
            if let Some((len, _)) = packet::respond(&rx[..n], mac, lease.ip, port, &mut tx) {
                net.send_raw(&tx[..len]);
            }
        }
        check_keyboard(&mut dec);
    }
}

/// DISCOVER → OFFER → REQUEST → ACK, restarting on a NAK or a timeout.
fn dhcp(
    net: &mut crate::net::Net,
    dec: &mut i8042::CtrlAltDel,
    mac: [u8; 6],
    xid: [u8; 4],
    rx: &mut [u8; MAX_FRAME],
    tx: &mut [u8; MAX_FRAME],
) -> Lease {
    let mut tries = 0u32;
    loop {
        tries += 1;
        if tries == 5 {
            println!("net-serve: no DHCP answer yet, still trying");
        }
        let len = packet::dhcp_client_frame(tx, mac, xid, None);
        net.send_raw(&tx[..len]);
        let Some(offer) = wait_reply(net, dec, mac, xid, rx, |r| match r {
            DhcpReply::Offer(l) => Some(l),
            _ => None,
        }) else {
            continue;
        };
        let len = packet::dhcp_client_frame(tx, mac, xid, Some((offer.ip, offer.server)));
        net.send_raw(&tx[..len]);
        // Some(Some(lease)) on ACK, Some(None) on NAK (start over), None on timeout.
        let got = wait_reply(net, dec, mac, xid, rx, |r| match r {
            DhcpReply::Ack(l) => Some(Some(l)),
            DhcpReply::Nak => Some(None),
            DhcpReply::Offer(_) => None,
        });
        if let Some(Some(lease)) = got {
            return lease;
        }
    }
}

/// Waits up to [`DHCP_WAIT_MS`] for a DHCP answer that `pick` accepts (`Some(value)`).
fn wait_reply<T>(
    net: &mut crate::net::Net,
    dec: &mut i8042::CtrlAltDel,
    mac: [u8; 6],
    xid: [u8; 4],
    rx: &mut [u8; MAX_FRAME],
    pick: impl Fn(DhcpReply) -> Option<T>,
) -> Option<T> {
    let mut waited = 0;
    while waited < DHCP_WAIT_MS {
        if let Some(n) = net.recv_raw(POLL_MS, rx) {
            if let Some(v) = packet::parse_dhcp(&rx[..n], mac, xid).and_then(&pick) {
                return Some(v);
            }
        } else {
            waited += POLL_MS;
        }
        check_keyboard(dec);
    }
    None
}
