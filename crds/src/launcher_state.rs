//! The launcher's state, the `state` field of its control socket's answers (`status`, `watch`
//! and the answers to `pause`, `unpause`, `shutdown`, `stop`), written by `virt-launcher` and
//! read by the node agent `virt-handler`. This is the one list of its values:
//!
//! | value | meaning |
//! |---|---|
//! | `starting` | the VMM is being set up |
//! | `running` | the vCPUs run |
//! | `paused` | the vCPUs are paused (`pause`, a snapshot, a restore that waits for `unpause`) |
//! | `shutting-down` | the guest was asked to shut down (SIGTERM or `shutdown`); hard stop after the grace period |
//! | `stopping` | `stop` was asked: the VM is stopped now (only in the answer to `stop`) |
//! | `stopped` | the VM has ended (the last `watch` line) |
//!
//! A reader keeps a value it does not know ([`LauncherState::Other`], a newer launcher's) and
//! treats it as "not running".

use std::fmt;

/// See the module doc.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum LauncherState {
    #[default]
    Starting,
    Running,
    Paused,
    ShuttingDown,
    Stopping,
    Stopped,
    /// A value this build does not know, as written: the launcher never writes one.
    Other(String),
}

impl LauncherState {
    /// Every state the launcher writes.
    pub const KNOWN: [LauncherState; 6] = [
        Self::Starting,
        Self::Running,
        Self::Paused,
        Self::ShuttingDown,
        Self::Stopping,
        Self::Stopped,
    ];

    /// The value as written on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::ShuttingDown => "shutting-down",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Other(s) => s,
        }
    }

    /// Reads a value: one of [`LauncherState::KNOWN`] (exactly, case-sensitive), else
    /// [`LauncherState::Other`] with the value as it is. Never fails, and
    /// `parse(s).as_str() == s` for every `s`.
    pub fn parse(s: &str) -> Self {
        Self::KNOWN
            .into_iter()
            .find(|k| k.as_str() == s)
            .unwrap_or_else(|| Self::Other(s.to_string()))
    }
}

impl fmt::Display for LauncherState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_states_are_the_launchers_strings() {
        let names: Vec<&str> = LauncherState::KNOWN.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "starting",
                "running",
                "paused",
                "shutting-down",
                "stopping",
                "stopped"
            ]
        );
        for s in LauncherState::KNOWN {
            assert_eq!(LauncherState::parse(s.as_str()), s);
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(LauncherState::default(), LauncherState::Starting);
    }

    #[test]
    fn other_values_are_kept_as_written() {
        for s in [
            "",
            "hibernating",
            "Running",
            " running",
            "running ",
            "stopped\n",
            "é",
        ] {
            let st = LauncherState::parse(s);
            assert_eq!(st, LauncherState::Other(s.to_string()));
            assert_eq!(st.as_str(), s);
            assert_eq!(st.to_string(), s);
        }
    }
}
