//! The control annotations on a launcher pod: the operator asks the node agent `virt-handler`
//! to send a command to the pod's launcher, and the agent answers on the same pod. This module
//! is the one description of their values; the docs point here.
//!
//! ```text
//! microvirt.io/control-request: <id> <command>
//! microvirt.io/control-result:  <id> ok
//!                               <id> ok <detail>
//!                               <id> error <message>
//! ```
//!
//! - `<id>`: a token without whitespace, new for every request; the agent carries a request
//!   out once per id and answers under the same id. The operator uses `claim-<vmi uid>` (a warm
//!   pool member is claimed: resume it) and `snap-<snapshot id>` (a pool's builder: snapshot it).
//! - `<command>` ([`ControlCommand`]): `pause`, `unpause` or `snapshot` (write a snapshot of the
//!   VM into the pod's snapshot mount; the VM stays paused).
//! - `<detail>`: after a `snapshot`, the node's host facts (`microvirt.io/host-facts`), when the
//!   agent knows them. Nothing after `ok` otherwise.
//! - `<message>`: why the request failed, for humans; a malformed request or an unknown command
//!   is answered with an error too, under the request's id.
//!
//! Writers print exactly the shapes above ([`ControlRequest`] and [`ControlResult`] as
//! `Display`). Readers are more lenient, and stay so (values written by hand with
//! `kubectl annotate` keep working):
//!
//! - A request's fields are separated by runs of whitespace; whitespace around them is ignored.
//!   It has exactly two fields, else it is malformed. Its id is its first field even when the
//!   rest is malformed ([`id_of`]), so that the agent can answer it.
//! - A result's id runs up to its first space: a result answers request `<id>` when it is
//!   `<id>` followed by a space or by nothing. After it (and any further whitespace) `ok`,
//!   followed by a space or by nothing, is success, with the rest, trimmed, as its detail.
//!   Anything else is a failure whose message is the rest, trimmed, without a leading
//!   `error` (so possibly empty): nothing but `ok` reads as success. The agent itself
//!   remembers which request it answered by the result's first whitespace-separated field
//!   ([`id_of`]); for what it writes the two agree.

use std::fmt;
use std::str::FromStr;

/// Annotation on launcher pods, written by the operator: a [`ControlRequest`].
pub const ANNOTATION_CONTROL_REQUEST: &str = "microvirt.io/control-request";
/// Annotation on launcher pods, written by the node agent when it has carried out (or refused)
/// a control request: a [`ControlResult`].
pub const ANNOTATION_CONTROL_RESULT: &str = "microvirt.io/control-result";

/// Why a control annotation's value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Empty, only whitespace, or (a result) starting with a space.
    #[error("no id")]
    MissingId,
    /// A request with other than two fields.
    #[error("want \"<id> <command>\"")]
    Malformed,
    /// A request whose second field is not a [`ControlCommand`].
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
}

/// What a control request asks of the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlCommand {
    /// Pause the VM's vCPUs.
    Pause,
    /// Resume them (a warm pool member's claim).
    Unpause,
    /// Write a snapshot of the VM into the pod's snapshot mount (a pool's builder).
    Snapshot,
}

impl ControlCommand {
    /// Every command, in the order the docs list them.
    pub const ALL: [ControlCommand; 3] = [Self::Pause, Self::Unpause, Self::Snapshot];

    /// The command as written in a request.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Unpause => "unpause",
            Self::Snapshot => "snapshot",
        }
    }
}

impl fmt::Display for ControlCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ControlCommand {
    type Err = ParseError;

    /// Exactly one of the names, case-sensitive.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| ParseError::UnknownCommand(s.to_string()))
    }
}

/// The id of a request or result value: its first whitespace-separated field, even when the
/// rest is malformed. `None` when the value is empty or only whitespace.
pub fn id_of(value: &str) -> Option<&str> {
    value.split_whitespace().next()
}

/// `microvirt.io/control-request`: `<id> <command>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlRequest {
    /// A token without whitespace (else the printed value does not parse back).
    pub id: String,
    pub command: ControlCommand,
}

impl ControlRequest {
    pub fn new(id: impl Into<String>, command: ControlCommand) -> Self {
        Self {
            id: id.into(),
            command,
        }
    }

    /// Reads a request value (see the module doc for what is accepted).
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        let mut fields = s.split_whitespace();
        let id = fields.next().ok_or(ParseError::MissingId)?;
        let (Some(command), None) = (fields.next(), fields.next()) else {
            return Err(ParseError::Malformed);
        };
        Ok(Self::new(id, command.parse()?))
    }
}

impl fmt::Display for ControlRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id, self.command)
    }
}

impl FromStr for ControlRequest {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::parse(s)
    }
}

/// How a control request went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlOutcome {
    /// Carried out; with the detail after `ok`, if any.
    Ok(Option<String>),
    /// Failed or refused, and why (empty when the result said nothing).
    Error(String),
}

/// `microvirt.io/control-result`: `<id> ok`, `<id> ok <detail>` or `<id> error <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlResult {
    /// The id of the request this answers (a token without whitespace).
    pub id: String,
    pub outcome: ControlOutcome,
}

impl ControlResult {
    /// `<id> ok`, or `<id> ok <detail>` with a detail.
    pub fn ok(id: impl Into<String>, detail: Option<String>) -> Self {
        Self {
            id: id.into(),
            outcome: ControlOutcome::Ok(detail),
        }
    }

    /// `<id> error <message>`.
    pub fn error(id: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            outcome: ControlOutcome::Error(message.into()),
        }
    }

    /// Reads a result value (see the module doc for what is accepted). Refused only without
    /// an id: whatever follows the id is either success or a failure.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        let (id, rest) = s.split_once(' ').unwrap_or((s, ""));
        if id.is_empty() {
            return Err(ParseError::MissingId);
        }
        let rest = rest.trim_start();
        if let Some(detail) = rest.strip_prefix("ok") {
            if detail.is_empty() || detail.starts_with(' ') {
                let detail = detail.trim();
                return Ok(Self::ok(
                    id,
                    (!detail.is_empty()).then(|| detail.to_string()),
                ));
            }
        }
        Ok(Self::error(
            id,
            rest.strip_prefix("error").unwrap_or(rest).trim(),
        ))
    }
}

impl fmt::Display for ControlResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            ControlOutcome::Ok(None) => write!(f, "{} ok", self.id),
            ControlOutcome::Ok(Some(detail)) => write!(f, "{} ok {detail}", self.id),
            ControlOutcome::Error(message) => write!(f, "{} error {message}", self.id),
        }
    }
}

impl FromStr for ControlResult {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, command: ControlCommand) -> ControlRequest {
        ControlRequest::new(id, command)
    }

    #[test]
    fn requests_round_trip_for_every_command() {
        for (c, name) in [
            (ControlCommand::Pause, "pause"),
            (ControlCommand::Unpause, "unpause"),
            (ControlCommand::Snapshot, "snapshot"),
        ] {
            assert_eq!(c.as_str(), name);
            assert_eq!(name.parse(), Ok(c));
            let r = req("claim-7", c);
            let text = r.to_string();
            assert_eq!(text, format!("claim-7 {name}"));
            assert_eq!(ControlRequest::parse(&text), Ok(r.clone()));
            assert_eq!(text.parse(), Ok(r));
        }
        assert_eq!(ControlCommand::ALL.len(), 3);
    }

    #[test]
    fn requests_the_operator_and_the_agent_write_and_read() {
        use ControlCommand::*;
        for (text, id, command) in [
            ("claim-7 unpause", "claim-7", Unpause),
            ("claim-vmi-uid unpause", "claim-vmi-uid", Unpause),
            ("claim-u unpause", "claim-u", Unpause),
            ("claim-1 unpause", "claim-1", Unpause),
            ("snap-h1-1 snapshot", "snap-h1-1", Snapshot),
            ("snap-h-0 snapshot", "snap-h-0", Snapshot),
            ("p4 pause", "p4", Pause),
            // Runs of whitespace around and between the fields.
            ("  a   pause ", "a", Pause),
            ("a\tpause\n", "a", Pause),
        ] {
            assert_eq!(
                ControlRequest::parse(text),
                Ok(req(id, command)),
                "{text:?}"
            );
            assert_eq!(id_of(text), Some(id));
        }
    }

    #[test]
    fn malformed_requests_are_refused_and_keep_their_id() {
        for (text, err, id) in [
            ("", ParseError::MissingId, None),
            ("   \t", ParseError::MissingId, None),
            ("onlyid", ParseError::Malformed, Some("onlyid")),
            ("r3", ParseError::Malformed, Some("r3")),
            ("a b c", ParseError::Malformed, Some("a")),
            ("a pause now", ParseError::Malformed, Some("a")),
            (
                "r2 reboot",
                ParseError::UnknownCommand("reboot".into()),
                Some("r2"),
            ),
            (
                "a Pause",
                ParseError::UnknownCommand("Pause".into()),
                Some("a"),
            ),
            (
                "a unpause,",
                ParseError::UnknownCommand("unpause,".into()),
                Some("a"),
            ),
        ] {
            assert_eq!(ControlRequest::parse(text), Err(err), "{text:?}");
            assert_eq!(id_of(text), id, "{text:?}");
        }
    }

    #[test]
    fn results_round_trip() {
        for r in [
            ControlResult::ok("claim-1", None),
            ControlResult::ok("snap-h1-1", Some("cpu=A/1/2/3 kernel=k".into())),
            ControlResult::error("r2", "unknown command \"reboot\""),
            ControlResult::error("snap-h1-1", "no space left"),
        ] {
            assert_eq!(ControlResult::parse(&r.to_string()), Ok(r.clone()));
            assert_eq!(r.to_string().parse(), Ok(r.clone()));
            assert_eq!(id_of(&r.to_string()), Some(r.id.as_str()));
        }
    }

    #[test]
    fn results_print_as_the_agent_wrote_them() {
        assert_eq!(ControlResult::ok("claim-1", None).to_string(), "claim-1 ok");
        assert_eq!(
            ControlResult::ok("snap-a-1", Some("cpu=X/1/2/3 kernel=6.1".into())).to_string(),
            "snap-a-1 ok cpu=X/1/2/3 kernel=6.1"
        );
        // An empty detail or message is printed as given.
        assert_eq!(
            ControlResult::ok("x", Some(String::new())).to_string(),
            "x ok "
        );
        assert_eq!(ControlResult::error("x", "").to_string(), "x error ");
        assert_eq!(
            ControlResult::error("x", "disk full").to_string(),
            "x error disk full"
        );
    }

    #[test]
    fn results_the_operator_and_the_agent_read() {
        let ok = |id: &str, d: Option<&str>| Ok(ControlResult::ok(id, d.map(str::to_string)));
        let err = |id: &str, m: &str| Ok(ControlResult::error(id, m));
        for (text, want) in [
            ("claim-u ok", ok("claim-u", None)),
            ("x ok", ok("x", None)),
            ("x ok ", ok("x", None)),
            ("x   ok  ", ok("x", None)),
            (
                "snap-a-1 ok cpu=X/1/2/3 kernel=6.1",
                ok("snap-a-1", Some("cpu=X/1/2/3 kernel=6.1")),
            ),
            ("x ok  spaced detail ", ok("x", Some("spaced detail"))),
            ("snap-a-1 error disk full", err("snap-a-1", "disk full")),
            (
                "claim-u error launcher gone",
                err("claim-u", "launcher gone"),
            ),
            ("x error", err("x", "")),
            ("x error  ", err("x", "")),
            // Only `ok` is success: anything else is a failure, `error` or not.
            ("x", err("x", "")),
            ("x okay", err("x", "okay")),
            ("x ok\tdetail", err("x", "ok\tdetail")),
            ("x garbage", err("x", "garbage")),
            ("x errorfoo", err("x", "foo")),
            // The id runs up to the first space.
            ("x\tok", err("x\tok", "")),
            ("a-b ok", ok("a-b", None)),
        ] {
            assert_eq!(ControlResult::parse(text), want, "{text:?}");
        }
    }

    #[test]
    fn results_without_an_id_are_refused() {
        for text in ["", " ", " x ok", "  ok"] {
            assert_eq!(ControlResult::parse(text), Err(ParseError::MissingId));
        }
    }

    #[test]
    fn any_input_is_read_without_panicking() {
        // Every short string over an alphabet of the grammar's pieces, odd whitespace and
        // multi-byte characters.
        let alphabet = [
            "", " ", "\t", "\u{a0}", "é", "ok", "error", "pause", "snapshot", "x", "\n",
        ];
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    for d in alphabet {
                        let s = format!("{a}{b}{c}{d}");
                        if let Ok(r) = ControlRequest::parse(&s) {
                            assert_eq!(ControlRequest::parse(&r.to_string()), Ok(r));
                        }
                        if let Ok(r) = ControlResult::parse(&s) {
                            assert!(!r.id.is_empty() && !r.id.contains(' '));
                            assert_eq!(ControlResult::parse(&r.to_string()), Ok(r));
                        }
                        let _ = id_of(&s);
                    }
                }
            }
        }
    }
}
