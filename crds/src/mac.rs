//! The Ethernet MAC address of a guest NIC: the one type for it, shared by the VMM (`--net
//! tap=NAME,mac=...`, its JSON config and snapshots), the pod network setup (`netsetup`) and
//! `virt-launcher`, which reads it from a VMI interface's `macAddress`.
//!
//! Written as six pairs of hex digits separated by `:` or `-` (either case, the separators may
//! mix, as the VMI schema's pattern allows); printed in lower case with `:`. A multicast address
//! (lowest bit of the first byte set) is refused: a guest's virtio-net driver would throw it
//! away and pick a random one, so the host side would not know the guest's address.

use std::fmt;
use std::str::FromStr;

/// An Ethernet MAC address, written `52:54:00:12:34:56` (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "String", into = "String")
)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// `bytes` made a locally administered unicast address (`x2:..`, `x6:..`, `xa:..`,
    /// `xe:..`): the low two bits of the first byte set to `10`, the rest kept. Fed random
    /// bytes, a random address that no vendor owns.
    pub fn locally_administered(mut bytes: [u8; 6]) -> Self {
        bytes[0] = (bytes[0] & 0xfc) | 0x02;
        MacAddr(bytes)
    }

    /// Whether this is a multicast (group) address.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
}

/// A MAC address that [`MacAddr`] does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacParseError {
    /// Not six pairs of hex digits.
    #[error(
        "invalid MAC address {0:?} (want six hex pairs separated by ':' or '-', like 52:54:00:12:34:56)"
    )]
    Invalid(String),
    /// A multicast address.
    #[error("MAC address {0:?} is a multicast address (lowest bit of the first byte set)")]
    Multicast(String),
}

impl FromStr for MacAddr {
    type Err = MacParseError;
    fn from_str(s: &str) -> Result<Self, MacParseError> {
        let bad = || MacParseError::Invalid(s.to_string());
        let mut m = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in m.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        let mac = MacAddr(m);
        if mac.is_multicast() {
            return Err(MacParseError::Multicast(s.to_string()));
        }
        Ok(mac)
    }
}

impl TryFrom<String> for MacAddr {
    type Error = MacParseError;
    fn try_from(s: String) -> Result<Self, MacParseError> {
        s.parse()
    }
}

impl From<MacAddr> for String {
    fn from(m: MacAddr) -> String {
        m.to_string()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let m: MacAddr = "02:00:00:AB:cd:01".parse().unwrap();
        assert_eq!(m.0, [2, 0, 0, 0xab, 0xcd, 1]);
        assert_eq!(m.to_string(), "02:00:00:ab:cd:01");
        assert_eq!("02-00-00-ab-cd-01".parse::<MacAddr>().unwrap(), m);
        assert_eq!("02:00-00:ab-cd:01".parse::<MacAddr>().unwrap(), m);
        assert_eq!(String::from(m).parse::<MacAddr>().unwrap(), m);
        for bad in [
            "",
            "1",
            "02:00:00:ab:cd",
            "02:00:00:ab:cd:01:02",
            "02:00:00:ab:cd:1",
            "02:00:00:ab:cd:zz",
            "020:0:00:ab:cd:01",
            "+2:00:00:ab:cd:01",
            "02.00.00.ab.cd.01",
        ] {
            assert_eq!(
                bad.parse::<MacAddr>(),
                Err(MacParseError::Invalid(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            "01:00:5e:00:00:01".parse::<MacAddr>(),
            Err(MacParseError::Multicast("01:00:5e:00:00:01".into()))
        );
        assert!(MacParseError::Invalid("1".into())
            .to_string()
            .contains("52:54:00:12:34:56"));
    }

    #[test]
    fn locally_administered_unicast() {
        for b in [[0u8; 6], [0xff; 6], [0x01, 2, 3, 4, 5, 6]] {
            let m = MacAddr::locally_administered(b);
            assert_eq!(m.0[0] & 0x03, 0x02, "{m}");
            assert_eq!(m.0[0] & 0xfc, b[0] & 0xfc, "{m}");
            assert_eq!(m.0[1..], b[1..]);
            assert!(!m.is_multicast());
            assert_eq!(m.to_string().parse::<MacAddr>().unwrap(), m);
        }
    }
}
