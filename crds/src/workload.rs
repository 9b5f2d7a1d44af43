//! The workload of a VM booted from an OCI container image (docs/oci-images.md): what the
//! guest's init (`microvirt-init`, `guest-images/init`) runs, as the launcher resolved it from
//! the image's configuration and the VMI's overrides — the way a container runtime applies a
//! Pod container's `command`, `args`, `env` and `workingDir` over an image's `Entrypoint`, `Cmd`,
//! `Env` and `WorkingDir`.
//!
//! The launcher writes a [`Workload`] as JSON into the initramfs it gives the guest
//! ([`WORKLOAD_PATH`]); the init reads it. Both sides use this one type (feature `serde`).
//!
//! The image's configuration is the OCI image configuration's `config` object ([`ImageConfig`],
//! the keys as the OCI image spec spells them).

/// Where the workload description lies in the guest's initramfs.
pub const WORKLOAD_PATH: &str = "/microvirt/workload.json";
/// The `PATH` a workload gets when neither the image nor the VMI sets one (what container
/// runtimes use).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Guest-physical address of the VMM's boot-timer page (one page of MMIO): a write of
/// [`BOOT_TIMER_MAGIC`] at offset 0 is the boot marker (the VMM's `layout::BOOT_TIMER_ADDR`).
pub const BOOT_TIMER_ADDR: u64 = 0xc000_0000;
/// The boot marker's byte.
pub const BOOT_TIMER_MAGIC: u8 = 123;
/// Byte offset, in the boot-timer page, of the register the init writes the workload's exit
/// status to (one byte) right before the VM powers off.
pub const EXIT_STATUS_OFFSET: u64 = 8;
/// Longest workload description the init reads, in bytes.
pub const MAX_WORKLOAD_BYTES: u64 = 1 << 20;

/// An environment variable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// What the guest's init runs, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "camelCase"))]
pub struct Workload {
    /// The program and its arguments (never empty). A program without `/` is looked up in the
    /// workload's `PATH` inside the image.
    pub argv: Vec<String>,
    /// The environment, in order; `PATH` always present.
    pub env: Vec<EnvVar>,
    /// Absolute working directory (created when the image lacks it, as runc does).
    pub working_dir: String,
    /// The image's `User`: `uid`, `uid:gid`, `name` or `name:group` (names looked up in the
    /// image's `/etc/passwd` and `/etc/group`); empty: root.
    #[cfg_attr(feature = "serde", serde(default))]
    pub user: String,
    /// The guest's host name (the VMI's).
    #[cfg_attr(feature = "serde", serde(default))]
    pub hostname: String,
    /// The block device holding the image's files (read-only erofs), e.g. `/dev/vda`.
    pub root_device: String,
    /// Size limit of the writable layer (a tmpfs under the overlay), in bytes; 0: the kernel's
    /// default (half the guest's memory).
    #[cfg_attr(feature = "serde", serde(default))]
    pub scratch_bytes: u64,
}

/// The parts of an OCI image configuration's `config` object a workload uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "PascalCase"))]
pub struct ImageConfig {
    #[cfg_attr(feature = "serde", serde(default))]
    pub entrypoint: Option<Vec<String>>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub cmd: Option<Vec<String>>,
    /// `NAME=value` strings.
    #[cfg_attr(feature = "serde", serde(default))]
    pub env: Option<Vec<String>>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub working_dir: Option<String>,
    #[cfg_attr(feature = "serde", serde(default))]
    pub user: Option<String>,
}

/// What a VMI sets over the image's configuration (a Pod container's fields).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    pub env: Vec<EnvVar>,
    pub working_dir: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadError {
    #[error("nothing to run: the image has no Entrypoint or Cmd and the VMI sets no command")]
    NoCommand,
    #[error("workingDir {0:?} is not an absolute path")]
    WorkingDir(String),
    #[error("environment variable {0:?}: the name is empty or holds '=' or NUL")]
    EnvName(String),
    #[error("{0} holds a NUL byte")]
    Nul(&'static str),
}

/// Resolves what runs, as Kubernetes documents it for a container: `command` replaces the
/// image's Entrypoint and drops its Cmd; `args` alone replaces the Cmd; the VMI's `env` is
/// applied over the image's (same name: the VMI's value, in the image's place); `workingDir`
/// replaces the image's. `root_device`, `hostname` and `scratch_bytes` are the launcher's.
pub fn resolve(
    image: &ImageConfig,
    overrides: &Overrides,
    root_device: &str,
    hostname: &str,
    scratch_bytes: u64,
) -> Result<Workload, WorkloadError> {
    let argv: Vec<String> = match (&overrides.command, &overrides.args) {
        (Some(c), Some(a)) => c.iter().chain(a).cloned().collect(),
        (Some(c), None) => c.clone(),
        (None, Some(a)) => image
            .entrypoint
            .iter()
            .flatten()
            .chain(a)
            .cloned()
            .collect(),
        (None, None) => image
            .entrypoint
            .iter()
            .flatten()
            .chain(image.cmd.iter().flatten())
            .cloned()
            .collect(),
    };
    if argv.is_empty() || argv[0].is_empty() {
        return Err(WorkloadError::NoCommand);
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(WorkloadError::Nul("the command"));
    }
    let mut env: Vec<EnvVar> = Vec::new();
    let mut set = |name: &str, value: &str| -> Result<(), WorkloadError> {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(WorkloadError::EnvName(name.to_string()));
        }
        if value.contains('\0') {
            return Err(WorkloadError::Nul("an environment value"));
        }
        match env.iter_mut().find(|e| e.name == name) {
            Some(e) => e.value = value.to_string(),
            None => env.push(EnvVar {
                name: name.to_string(),
                value: value.to_string(),
            }),
        }
        Ok(())
    };
    for kv in image.env.iter().flatten() {
        // An image entry without '=' sets the variable to the empty string (as Docker does).
        let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
        set(k, v)?;
    }
    for e in &overrides.env {
        set(&e.name, &e.value)?;
    }
    if !env.iter().any(|e| e.name == "PATH") {
        env.insert(
            0,
            EnvVar {
                name: "PATH".into(),
                value: DEFAULT_PATH.into(),
            },
        );
    }
    let working_dir = overrides
        .working_dir
        .clone()
        .or_else(|| image.working_dir.clone().filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".into());
    if !working_dir.starts_with('/') {
        return Err(WorkloadError::WorkingDir(working_dir));
    }
    if working_dir.contains('\0') {
        return Err(WorkloadError::Nul("workingDir"));
    }
    Ok(Workload {
        argv,
        env,
        working_dir,
        user: image.user.clone().unwrap_or_default(),
        hostname: hostname.to_string(),
        root_device: root_device.to_string(),
        scratch_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> ImageConfig {
        ImageConfig {
            entrypoint: Some(vec!["/entry".into(), "-e".into()]),
            cmd: Some(vec!["serve".into()]),
            env: Some(vec!["PATH=/opt/bin".into(), "A=1".into(), "EMPTY".into()]),
            working_dir: Some("/app".into()),
            user: Some("1000:1000".into()),
        }
    }

    fn argv(o: Overrides) -> Vec<String> {
        resolve(&image(), &o, "/dev/vda", "h", 0).unwrap().argv
    }

    fn strings(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn command_and_args_apply_as_for_a_pod_container() {
        assert_eq!(argv(Overrides::default()), ["/entry", "-e", "serve"]);
        let args = Overrides {
            args: strings(&["x"]),
            ..Default::default()
        };
        assert_eq!(argv(args), ["/entry", "-e", "x"]);
        let command = Overrides {
            command: strings(&["sh"]),
            ..Default::default()
        };
        assert_eq!(argv(command), ["sh"]);
        let both = Overrides {
            command: strings(&["sh", "-c"]),
            args: strings(&["echo hi"]),
            ..Default::default()
        };
        assert_eq!(argv(both), ["sh", "-c", "echo hi"]);
        let none = ImageConfig::default();
        assert_eq!(
            resolve(&none, &Overrides::default(), "/dev/vda", "", 0),
            Err(WorkloadError::NoCommand)
        );
    }

    #[test]
    fn env_working_dir_and_user() {
        let o = Overrides {
            env: vec![
                EnvVar {
                    name: "A".into(),
                    value: "2".into(),
                },
                EnvVar {
                    name: "B".into(),
                    value: "3".into(),
                },
            ],
            ..Default::default()
        };
        let w = resolve(&image(), &o, "/dev/vdb", "vm1", 64 << 20).unwrap();
        let env: Vec<_> = w
            .env
            .iter()
            .map(|e| format!("{}={}", e.name, e.value))
            .collect();
        assert_eq!(env, ["PATH=/opt/bin", "A=2", "EMPTY=", "B=3"]);
        assert_eq!(w.working_dir, "/app");
        assert_eq!(w.user, "1000:1000");
        assert_eq!(
            (w.root_device.as_str(), w.hostname.as_str(), w.scratch_bytes),
            ("/dev/vdb", "vm1", 64 << 20)
        );
        // No PATH anywhere: the runtimes' default; no WorkingDir: "/".
        let bare = ImageConfig {
            cmd: strings(&["x"]),
            ..Default::default()
        };
        let w = resolve(&bare, &Overrides::default(), "/dev/vda", "", 0).unwrap();
        assert_eq!(w.env[0].value, DEFAULT_PATH);
        assert_eq!(w.working_dir, "/");
        let rel = Overrides {
            working_dir: Some("app".into()),
            ..Default::default()
        };
        assert_eq!(
            resolve(&image(), &rel, "/dev/vda", "", 0),
            Err(WorkloadError::WorkingDir("app".into()))
        );
        let bad = Overrides {
            env: vec![EnvVar {
                name: "A=B".into(),
                value: String::new(),
            }],
            ..Default::default()
        };
        assert!(matches!(
            resolve(&image(), &bad, "/dev/vda", "", 0),
            Err(WorkloadError::EnvName(_))
        ));
    }
}
