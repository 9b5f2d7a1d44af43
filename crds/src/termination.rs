//! The launcher's termination message (`/dev/termination-log`), written by `virt-launcher` and
//! read back by the operator from the pod's `containerStatuses[].state.terminated.message`
//! (docs/launcher-pod.md).
//!
//! ```text
//! guest reset after the shutdown request      ← one line for humans, at most 256 bytes
//! reason=GuestShutdown                        ← machine-readable reason: a [`Reason`]
//! exitCode=0                                  ← the launcher's exit code: [`exit_code`]
//! bootTimeMs=142                              ← once the guest has booted
//! shutdownRequested=signal                    ← only when the launcher was asked to stop the VM
//! ```
//!
//! `shutdownRequested` tells a shutdown the launcher was asked for (SIGTERM from the kubelet:
//! pod deleted, evicted, node shutting down; or the control socket's `shutdown`/`stop`) from one
//! the guest chose by itself; the operator maps the first to `Failed` unless the VMI itself is
//! being deleted, as KubeVirt documents for `RerunOnFailure`.

use std::fmt;

/// Longest first line, in bytes.
pub const MAX_FIRST_LINE: usize = 256;
/// Key of the machine-readable reason.
pub const KEY_REASON: &str = "reason";
/// Key of the exit code.
pub const KEY_EXIT_CODE: &str = "exitCode";
/// Key of the boot time (milliseconds from launcher start to the guest's boot-timer write).
pub const KEY_BOOT_TIME_MS: &str = "bootTimeMs";
/// Key present when the VM was stopped because the launcher was asked to stop it.
pub const KEY_SHUTDOWN_REQUESTED: &str = "shutdownRequested";

/// The launcher's exit codes (the compute container's `state.terminated.exitCode`), written by
/// `virt-launcher` and read by the operator.
pub mod exit_code {
    /// The guest shut down (reset or power-off).
    pub const CLEAN: u8 = 0;
    /// The guest crashed or the VMM failed while running.
    pub const CRASH: u8 = 1;
    /// Bad usage or an invalid VMI.
    pub const USAGE: u8 = 2;
    /// Preparing the VM failed (disks, kernel, KVM).
    pub const SETUP: u8 = 3;
    /// The guest ignored the shutdown request; stopped after the grace period.
    pub const GRACE_EXPIRED: u8 = 4;
    /// Stopped on request (control `stop`, or a second SIGTERM/SIGINT).
    pub const STOPPED: u8 = 5;
    /// The guest's workload (a VM booted from an OCI image) exited with a non-zero status.
    pub const WORKLOAD_FAILED: u8 = 6;
}

/// Why the launcher ended: the `reason=` of its termination message. This is the one list of
/// the values the launcher writes; a reader keeps the field as a string (a newer launcher may
/// write one this build does not know) and looks it up with [`Reason::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The guest reset or powered off.
    GuestShutdown,
    /// The guest ignored the shutdown request; stopped after the grace period.
    GracePeriodExpired,
    /// Stopped on request (control `stop`, or a second signal).
    Stopped,
    /// The guest crashed while running (triple fault, KVM internal error, …; the message names
    /// it).
    GuestCrashed,
    /// The VMM itself failed while the VM ran.
    VmmFailed,
    /// Preparing the VM failed (disks, kernel, KVM, the pod network, …).
    SetupFailed,
    /// The boot disk holds no kernel the launcher can boot, and no fallback kernel applies.
    NoBootableKernel,
    /// The VMI document (or the launcher's user) is not usable.
    InvalidVmi,
    /// The workload of a VM booted from an OCI image exited with a non-zero status (the
    /// message names it); status 0 is a [`Reason::GuestShutdown`], as a Job's pod succeeds.
    WorkloadFailed,
}

impl Reason {
    /// Every value.
    pub const ALL: [Reason; 9] = [
        Self::GuestShutdown,
        Self::GracePeriodExpired,
        Self::Stopped,
        Self::GuestCrashed,
        Self::VmmFailed,
        Self::SetupFailed,
        Self::NoBootableKernel,
        Self::InvalidVmi,
        Self::WorkloadFailed,
    ];

    /// The value as written after `reason=`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GuestShutdown => "GuestShutdown",
            Self::GracePeriodExpired => "GracePeriodExpired",
            Self::Stopped => "Stopped",
            Self::GuestCrashed => "GuestCrashed",
            Self::VmmFailed => "VmmFailed",
            Self::SetupFailed => "SetupFailed",
            Self::NoBootableKernel => "NoBootableKernel",
            Self::InvalidVmi => "InvalidVMI",
            Self::WorkloadFailed => "WorkloadFailed",
        }
    }

    /// The reason written as `s` (exactly, case-sensitive); `None` for another value.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The launcher's exit code with this reason ([`exit_code`]).
    pub fn exit_code(self) -> u8 {
        match self {
            Self::GuestShutdown => exit_code::CLEAN,
            Self::GracePeriodExpired => exit_code::GRACE_EXPIRED,
            Self::Stopped => exit_code::STOPPED,
            Self::GuestCrashed | Self::VmmFailed => exit_code::CRASH,
            Self::SetupFailed | Self::NoBootableKernel => exit_code::SETUP,
            Self::InvalidVmi => exit_code::USAGE,
            Self::WorkloadFailed => exit_code::WORKLOAD_FAILED,
        }
    }

    /// Whether the operator copies this reason to a failed VMI's `status.reason` as it is
    /// (other failures become `LauncherExited<code>`).
    pub fn is_vmi_reason(self) -> bool {
        matches!(
            self,
            Self::NoBootableKernel | Self::GuestCrashed | Self::VmmFailed | Self::WorkloadFailed
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who asked the launcher to stop the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownOrigin {
    /// SIGTERM, SIGINT or SIGHUP (the kubelet stopping the pod, or a user).
    Signal,
    /// The control socket (`shutdown` or `stop`).
    Control,
}

impl ShutdownOrigin {
    /// The value written after `shutdownRequested=`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Signal => "signal",
            Self::Control => "control",
        }
    }
}

impl fmt::Display for ShutdownOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A termination message, rendered by the launcher and parsed by the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminationMessage {
    /// The human-readable first line.
    pub message: String,
    /// Machine-readable reason: a [`Reason`] as the launcher wrote it, kept as a string so
    /// that a value this build does not know survives.
    pub reason: Option<String>,
    /// The launcher's exit code.
    pub exit_code: Option<i32>,
    /// Boot time in milliseconds.
    pub boot_time_ms: Option<u64>,
    /// Set when the launcher was asked to stop the VM (whatever the guest then did).
    pub shutdown_requested: Option<ShutdownOrigin>,
}

/// `s` on one line (control characters become spaces), cut to [`MAX_FIRST_LINE`] bytes.
fn first_line(s: &str) -> String {
    let mut line: String = s
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.len() > MAX_FIRST_LINE {
        let mut cut = MAX_FIRST_LINE;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

impl TerminationMessage {
    /// The file content: the first line, then one `key=value` line per known field.
    pub fn render(&self) -> String {
        let mut s = first_line(&self.message);
        s.push('\n');
        if let Some(r) = &self.reason {
            s.push_str(&format!("{KEY_REASON}={}\n", first_line(r)));
        }
        if let Some(c) = self.exit_code {
            s.push_str(&format!("{KEY_EXIT_CODE}={c}\n"));
        }
        if let Some(ms) = self.boot_time_ms {
            s.push_str(&format!("{KEY_BOOT_TIME_MS}={ms}\n"));
        }
        if let Some(o) = self.shutdown_requested {
            s.push_str(&format!("{KEY_SHUTDOWN_REQUESTED}={o}\n"));
        }
        s
    }

    /// Parse a message as the kubelet reports it. Unknown keys and malformed values are
    /// ignored; a message that is not ours yields just its first line.
    pub fn parse(text: &str) -> Self {
        let mut lines = text.lines();
        let mut m = TerminationMessage {
            message: first_line(lines.next().unwrap_or("")),
            ..Default::default()
        };
        for line in lines {
            let Some((k, v)) = line.trim().split_once('=') else {
                continue;
            };
            let v = v.trim();
            match k.trim() {
                KEY_REASON if !v.is_empty() => m.reason = Some(v.to_string()),
                KEY_EXIT_CODE => m.exit_code = v.parse().ok().or(m.exit_code),
                KEY_BOOT_TIME_MS => m.boot_time_ms = v.parse().ok().or(m.boot_time_ms),
                KEY_SHUTDOWN_REQUESTED => {
                    m.shutdown_requested = match v {
                        "signal" => Some(ShutdownOrigin::Signal),
                        "control" => Some(ShutdownOrigin::Control),
                        _ => m.shutdown_requested,
                    }
                }
                _ => {}
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_parses_back() {
        let m = TerminationMessage {
            message: "guest reset after the shutdown request".into(),
            reason: Some("GuestShutdown".into()),
            exit_code: Some(0),
            boot_time_ms: Some(9),
            shutdown_requested: Some(ShutdownOrigin::Signal),
        };
        let text = m.render();
        assert_eq!(
            text,
            "guest reset after the shutdown request\nreason=GuestShutdown\nexitCode=0\nbootTimeMs=9\nshutdownRequested=signal\n"
        );
        assert_eq!(TerminationMessage::parse(&text), m);
    }

    #[test]
    fn reasons_parse_back_and_carry_their_exit_code() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            assert_eq!(r.to_string(), r.as_str());
        }
        assert_eq!(Reason::parse("guestshutdown"), None);
        assert_eq!(Reason::parse("LauncherExited3"), None);
        assert_eq!(Reason::InvalidVmi.as_str(), "InvalidVMI");
        assert_eq!(Reason::GuestShutdown.exit_code(), 0);
        assert_eq!(Reason::GuestCrashed.exit_code(), 1);
        assert_eq!(Reason::VmmFailed.exit_code(), 1);
        assert_eq!(Reason::InvalidVmi.exit_code(), 2);
        assert_eq!(Reason::SetupFailed.exit_code(), 3);
        assert_eq!(Reason::NoBootableKernel.exit_code(), 3);
        assert_eq!(Reason::GracePeriodExpired.exit_code(), 4);
        assert_eq!(Reason::Stopped.exit_code(), 5);
        assert_eq!(Reason::WorkloadFailed.exit_code(), 6);
        let vmi: Vec<&str> = Reason::ALL
            .into_iter()
            .filter(|r| r.is_vmi_reason())
            .map(Reason::as_str)
            .collect();
        assert_eq!(
            vmi,
            [
                "GuestCrashed",
                "VmmFailed",
                "NoBootableKernel",
                "WorkloadFailed"
            ]
        );
    }

    #[test]
    fn first_line_is_one_capped_line() {
        let m = TerminationMessage {
            message: format!("guest crashed: {}\nsecond line", "é".repeat(200)),
            ..Default::default()
        };
        let text = m.render();
        let first = text.lines().next().unwrap();
        assert!(
            first.len() <= MAX_FIRST_LINE && first.len() > 250,
            "{}",
            first.len()
        );
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn foreign_and_partial_messages() {
        let m = TerminationMessage::parse(
            "killed\nbootTimeMs=x\nexitCode=137\nwho=me\nshutdownRequested=maybe",
        );
        assert_eq!(m.message, "killed");
        assert_eq!(m.exit_code, Some(137));
        assert_eq!(m.boot_time_ms, None);
        assert_eq!(m.shutdown_requested, None);
        assert_eq!(TerminationMessage::parse(""), TerminationMessage::default());
    }
}
