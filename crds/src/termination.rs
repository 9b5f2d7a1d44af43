//! The launcher's termination message (`/dev/termination-log`), written by `virt-launcher` and
//! read back by the operator from the pod's `containerStatuses[].state.terminated.message`
//! (docs/launcher-pod.md).
//!
//! ```text
//! guest reset after the shutdown request      ← one line for humans, at most 256 bytes
//! reason=GuestShutdown                        ← machine-readable reason
//! exitCode=0
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

/// The boot disk holds no kernel the launcher can boot, and no fallback kernel applies.
pub const NO_BOOTABLE_KERNEL: &str = "NoBootableKernel";
/// The guest crashed while running (triple fault, KVM internal error, …; the message names it).
/// The launcher's own spelling (`launcher/src/runner.rs`) must stay equal.
pub const GUEST_CRASHED: &str = "GuestCrashed";
/// The VMM itself failed while the VM ran.
pub const VMM_FAILED: &str = "VmmFailed";
/// The launcher's reasons that the operator copies to the VMI's `status.reason` as they are
/// (other failures become `LauncherExited<code>`).
pub const VMI_REASONS: &[&str] = &[NO_BOOTABLE_KERNEL, GUEST_CRASHED, VMM_FAILED];

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
    /// Machine-readable reason (GuestShutdown, GuestCrashed, …).
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
