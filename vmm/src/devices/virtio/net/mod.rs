//! virtio-net over a TAP device.
//!
//! - `tap.rs`: `/dev/net/tun` (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR), offloads.
//! - `frames.rs`: pure RX/TX processing with back-pressure.
//! - `device.rs`: features (MAC, offloads the TAP supports), config space;
//!   `event_handler.rs`: event-loop glue (queue ioeventfds + TAP fd).

pub mod device;
pub mod event_handler;
pub mod frames;
pub mod persist;
pub mod tap;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use device::NetDevice;
pub use tap::{Tap, TapError};

/// The guest NIC's MAC address: the workspace's one MAC type (`microvirt_crds::mac`), which
/// refuses multicast addresses.
pub use microvirt_crds::mac::{MacAddr, MacParseError};

/// One `--net` / JSON `nets[]` entry.
///
/// CLI syntax: `tap=NAME[,mac=52:54:00:12:34:56]`.
/// JSON: `{"tap": "NAME", "mac": "52:54:00:12:34:56"}` (`mac` optional;
/// without it the device offers no MAC and the guest picks a random one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawNetConfig", into = "RawNetConfig")]
pub struct NetConfig {
    pub tap: String,
    pub mac: Option<MacAddr>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetConfig {
    tap: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<MacAddr>,
}

impl TryFrom<RawNetConfig> for NetConfig {
    type Error = NetConfigError;
    fn try_from(r: RawNetConfig) -> Result<Self, Self::Error> {
        let c = NetConfig {
            tap: r.tap,
            mac: r.mac,
        };
        c.validate()?;
        Ok(c)
    }
}

impl From<NetConfig> for RawNetConfig {
    fn from(c: NetConfig) -> Self {
        RawNetConfig {
            tap: c.tap,
            mac: c.mac,
        }
    }
}

/// Invalid network configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetConfigError {
    #[error("net: missing tap= (syntax: tap=NAME[,mac=52:54:00:12:34:56])")]
    MissingTap,
    #[error("net: unknown key {0:?} (known: tap, mac)")]
    UnknownKey(String),
    #[error("net: key {0:?} given twice")]
    Duplicate(String),
    #[error("net: key {0:?} needs a value")]
    EmptyValue(String),
    #[error("net: invalid TAP name {0:?} (1..=15 bytes, no '/', whitespace or NUL)")]
    BadTapName(String),
    #[error("net: {0}")]
    Mac(#[from] MacParseError),
}

impl NetConfig {
    pub fn validate(&self) -> Result<(), NetConfigError> {
        if self.tap.is_empty() {
            return Err(NetConfigError::MissingTap);
        }
        if !tap::valid_ifname(&self.tap) {
            return Err(NetConfigError::BadTapName(self.tap.clone()));
        }
        Ok(())
    }
}

impl FromStr for NetConfig {
    type Err = NetConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut tap, mut mac) = (None, None);
        let mut seen = std::collections::HashSet::new();
        for item in s.split(',') {
            if item.is_empty() {
                continue;
            }
            let (key, val) = item.split_once('=').unwrap_or((item, ""));
            if !seen.insert(key.to_string()) {
                return Err(NetConfigError::Duplicate(key.into()));
            }
            match key {
                "tap" | "mac" if val.is_empty() => {
                    return Err(NetConfigError::EmptyValue(key.into()))
                }
                "tap" => tap = Some(val.to_string()),
                "mac" => mac = Some(val.parse()?),
                k => return Err(NetConfigError::UnknownKey(k.into())),
            }
        }
        let c = NetConfig {
            tap: tap.ok_or(NetConfigError::MissingTap)?,
            mac,
        };
        c.validate()?;
        Ok(c)
    }
}

impl fmt::Display for NetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tap={}", self.tap)?;
        if let Some(m) = self.mac {
            write!(f, ",mac={m}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_syntax() {
        let c: NetConfig = "tap=tap0,mac=52:54:00:12:34:56".parse().unwrap();
        assert_eq!(c.tap, "tap0");
        assert_eq!(c.mac, Some(MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56])));
        assert_eq!(c.to_string(), "tap=tap0,mac=52:54:00:12:34:56");
        assert_eq!(
            "tap=t".parse::<NetConfig>().unwrap(),
            NetConfig {
                tap: "t".into(),
                mac: None
            }
        );
        assert_eq!(
            "mac=AA:bb:cc:dd:ee:ff,tap=x"
                .parse::<NetConfig>()
                .unwrap()
                .mac
                .unwrap()
                .to_string(),
            "aa:bb:cc:dd:ee:ff"
        );
    }

    #[test]
    fn clear_errors() {
        use NetConfigError::*;
        let e = |s: &str| s.parse::<NetConfig>().unwrap_err();
        assert_eq!(e("mac=52:54:00:12:34:56"), MissingTap);
        assert_eq!(e("tap="), EmptyValue("tap".into()));
        assert_eq!(e("tap=a,tap=b"), Duplicate("tap".into()));
        assert_eq!(e("tap=a,queues=2"), UnknownKey("queues".into()));
        assert_eq!(
            e("tap=averyveryverylongname"),
            BadTapName("averyveryverylongname".into())
        );
        for bad in [
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "zz:54:00:12:34:56",
            "5:54:00:12:34:56",
            "+5:54:00:12:34:56",
        ] {
            assert_eq!(
                e(&format!("tap=a,mac={bad}")),
                Mac(MacParseError::Invalid(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            e("tap=a,mac=01:00:5e:00:00:01"),
            Mac(MacParseError::Multicast("01:00:5e:00:00:01".into()))
        );
        assert!(e("tap=a,mac=1").to_string().contains("52:54:00:12:34:56"));
        // The VMI schema's spelling with '-' is the same address.
        let c: NetConfig = "tap=a,mac=52-54-00-12-34-56".parse().unwrap();
        assert_eq!(c.to_string(), "tap=a,mac=52:54:00:12:34:56");
    }

    #[test]
    fn json() {
        let c: NetConfig =
            serde_json::from_str(r#"{"tap":"tap0","mac":"52:54:00:12:34:56"}"#).unwrap();
        assert_eq!(c, "tap=tap0,mac=52:54:00:12:34:56".parse().unwrap());
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"tap":"tap0","mac":"52:54:00:12:34:56"}"#
        );
        let err = |j: &str| {
            serde_json::from_str::<NetConfig>(j)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"tap":"t","mac":"nope"}"#).contains("invalid MAC"));
        assert!(err(r#"{"tap":"t","x":1}"#).contains("unknown field `x`"));
        assert!(err(r#"{"mac":"52:54:00:12:34:56"}"#).contains("missing field `tap`"));
        assert!(err(r#"{"tap":""}"#).contains("missing tap"));
    }
}
