//! The launcher's capabilities (CAP_NET_ADMIN and CAP_NET_BIND_SERVICE) suffice for the setup.

use anyhow::{ensure, Result};
use netsetup::{Binding, InterfaceSpec};

use crate::fixture::{resolv, Fixture, GUEST_MAC};

const CAP_NET_BIND_SERVICE: u32 = 10;
const CAP_NET_ADMIN: u32 = 12;

/// Limits the calling thread's effective and permitted capabilities to `caps`.
fn limit_thread_caps(caps: &[u32]) -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    for c in caps {
        let d = &mut data[(*c / 32) as usize];
        d.effective |= 1 << (c % 32);
        d.permitted |= 1 << (c % 32);
    }
    // SAFETY: capset reads a v3 header and two data structs that live across the call; pid 0
    // is the calling thread only.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[test]
fn launcher_privileges_suffice_net_admin_and_net_bind_service() -> Result<()> {
    let fx = Fixture::new("caps")?;
    let spec = InterfaceSpec {
        mac: Some(GUEST_MAC.parse()?),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    // Only CAP_NET_ADMIN: everything but the DHCP server's port 67 works, and the partial
    // setup is rolled back with the same privileges.
    let r = fx.in_ns(&fx.pod, || -> Result<_> {
        limit_thread_caps(&[CAP_NET_ADMIN])?;
        Ok(netsetup::setup_pod_network(Binding::Masquerade, &spec))
    })??;
    let err = r.expect_err("port 67 needs CAP_NET_BIND_SERVICE");
    assert!(
        err.to_string().contains("DHCP socket") && err.to_string().contains("ermission"),
        "{err}"
    );
    let names: Vec<String> = fx.links(&fx.pod)?.into_iter().map(|l| l.name).collect();
    ensure!(
        !names.iter().any(|n| n == "k6t-eth0" || n == "tap0"),
        "{names:?}"
    );
    ensure!(fx.in_ns(&fx.pod, netsetup::nft::ip_tables)??.is_empty());

    // CAP_NET_ADMIN + CAP_NET_BIND_SERVICE (the launcher container's set): full setup, and the
    // guest gets its lease.
    let mut net = fx.in_ns(&fx.pod, || -> Result<_> {
        limit_thread_caps(&[CAP_NET_ADMIN, CAP_NET_BIND_SERVICE])?;
        Ok(netsetup::setup_pod_network(Binding::Masquerade, &spec)?)
    })??;
    fx.attach_vm(GUEST_MAC)?;
    assert_eq!(fx.dhcp_client()?["ip"], "10.0.2.2");
    // keep_on_drop: dropping stops the DHCP server but leaves the links and rules (the pod's
    // namespace goes away with the pod).
    net.keep_on_drop();
    drop(net);
    let names: Vec<String> = fx.links(&fx.pod)?.into_iter().map(|l| l.name).collect();
    ensure!(names.iter().any(|n| n == "k6t-eth0"), "{names:?}");
    ensure!(fx.in_ns(&fx.pod, netsetup::nft::ip_tables)??.len() == 1);
    Ok(())
}
