//! VM lifecycle as a state machine with checked transitions.
//!
//! ```text
//! Built (paused, never run) --resume--> Running <--pause/resume--> Paused
//!    \ \____________________ run paused (restored, waiting) __________/
//!     \__________________ stop ______|____________________________/--> Stopped
//!
//! Running or Paused --guest reboot--> Rebooting --done--> the state it came from
//!                                             \--failed--> Stopped
//! ```
//!
//! `Rebooting` lasts while the VMM thread resets vCPUs, devices and RAM and loads the kernel
//! again (an in-place reboot, `RebootPolicy::InPlace`); nothing else runs on that thread then.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmState {
    /// Fully built, vCPUs configured, nothing has run yet.
    Built,
    Running,
    Paused,
    /// An in-place reboot is resetting the VM.
    Rebooting,
    Stopped,
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            VmState::Built => "built",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Rebooting => "rebooting",
            VmState::Stopped => "stopped",
        };
        f.write_str(s)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cannot go from {from} to {to}")]
pub struct InvalidTransition {
    pub from: VmState,
    pub to: VmState,
}

/// Whether the VM may move from `from` to `to`.
pub const fn valid_transition(from: VmState, to: VmState) -> bool {
    use VmState::*;
    matches!(
        (from, to),
        (Built, Running | Paused)
            | (Running, Paused)
            | (Paused, Running)
            | (Running | Paused, Rebooting)
            | (Rebooting, Running | Paused)
            | (Built | Running | Paused | Rebooting, Stopped)
    )
}

/// Holds the current state; every change goes through [`Lifecycle::transition`].
#[derive(Debug)]
pub struct Lifecycle {
    state: VmState,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            state: VmState::Built,
        }
    }
}

impl Lifecycle {
    pub fn state(&self) -> VmState {
        self.state
    }

    pub fn transition(&mut self, to: VmState) -> Result<(), InvalidTransition> {
        if valid_transition(self.state, to) {
            self.state = to;
            Ok(())
        } else {
            Err(InvalidTransition {
                from: self.state,
                to,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::VmState::*;
    use super::*;

    #[test]
    fn every_pair_of_states() {
        let all = [Built, Running, Paused, Rebooting, Stopped];
        let allowed = [
            (Built, Running),
            (Built, Paused),
            (Built, Stopped),
            (Running, Paused),
            (Running, Stopped),
            (Paused, Running),
            (Paused, Stopped),
            (Running, Rebooting),
            (Paused, Rebooting),
            (Rebooting, Running),
            (Rebooting, Paused),
            (Rebooting, Stopped),
        ];
        for from in all {
            for to in all {
                assert_eq!(
                    valid_transition(from, to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn lifecycle_checks() {
        let mut l = Lifecycle::default();
        assert_eq!(
            l.transition(Built),
            Err(InvalidTransition {
                from: Built,
                to: Built
            })
        );
        l.transition(Running).unwrap();
        l.transition(Paused).unwrap();
        l.transition(Running).unwrap();
        l.transition(Rebooting).unwrap();
        assert!(l.transition(Rebooting).is_err());
        assert!(l.transition(Built).is_err());
        l.transition(Running).unwrap();
        l.transition(Stopped).unwrap();
        assert!(l.transition(Running).is_err());
        assert!(l.transition(Rebooting).is_err());
        assert_eq!(l.state(), Stopped);
    }
}
