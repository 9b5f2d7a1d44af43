//! The shared harness: the `virt-launcher` binary, demo-guest VMI files for run mode, a fake pod
//! filesystem for pod mode, loop devices for block-device volumes, and the check that every
//! launcher thread is locked down.

use std::path::{Path, PathBuf};
use std::process::Command;

use microvirt_testsupport::{Spawned, TempDir};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");

/// A running launcher, its stdout and stderr collected as they arrive; killed if still
/// running when its test ends.
pub(crate) type Launcher = Spawned;

pub(crate) fn demo_vmi(dir: &Path, name: &str, kernel_args: &str, extra_spec: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\n\
             metadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 10\n  domain:\n    \
             memory: {{guest: 32Mi}}\n    firmware: {{kernelBoot: {{kernelArgs: \"{kernel_args}\"}}}}\n{extra_spec}"
        ),
    )
    .unwrap();
    p
}

pub(crate) fn run_cmd(vmi: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("run").arg(vmi).args(extra);
    c
}

/// A fake pod filesystem: MICROVIRT_ROOT with vmi/vmi.json, the kernelBoot image's mount
/// with the demo guest at boot/vmlinux (as in microvirt/demo-kernel:dev), a termination log
/// path.
pub(crate) struct Pod {
    pub(crate) dir: TempDir,
}

impl Pod {
    pub(crate) fn new(tag: &str, vmi_json: &str) -> Self {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.path().join("root/vmi")).unwrap();
        std::fs::write(dir.path().join("root/vmi/vmi.json"), vmi_json).unwrap();
        std::fs::create_dir_all(dir.path().join("root/kernel-boot/boot")).unwrap();
        std::fs::write(
            dir.path().join("root/kernel-boot/boot/vmlinux"),
            launcher::demo::DEMO_GUEST,
        )
        .unwrap();
        Pod { dir }
    }
    pub(crate) fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub(crate) fn term_log(&self) -> PathBuf {
        self.dir.path().join("termination-log")
    }
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("MICROVIRT_ROOT", self.root())
            .env("MICROVIRT_TERMINATION_LOG", self.term_log());
        c
    }
    pub(crate) fn control(&self, cmd: &str) -> serde_json::Value {
        let out = self.cmd(&[cmd]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{cmd}: {e}: {text:?} {:?}", out.stderr));
        assert_eq!(out.status.success(), v["ok"] == true, "{v}");
        v
    }
    pub(crate) fn probe_ready(&self) -> bool {
        self.cmd(&["probe", "ready"]).status().unwrap().success()
    }
}

pub(crate) fn pod_document(name: &str, kernel_args: &str, grace: u32) -> String {
    serde_json::json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default", "uid": "0000-1111"},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "domain": {
                "cpu": {"cores": 4},
                "memory": {"guest": "1Gi"},
                "firmware": {"kernelBoot": {
                    "kernelArgs": kernel_args,
                    "container": {"image": "microvirt/demo-kernel:dev", "kernelPath": "/boot/vmlinux"}
                }},
                "devices": {"disks": [{"name": "seed", "disk": {"bus": "virtio"}}]}
            },
            "volumes": [{"name": "seed", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}]
        },
        "guestMemoryBytes": 33554432u64,
        "vcpus": 2
    })
    .to_string()
}

/// A loop block device over a file (`losetup`), detached on drop.
pub(crate) struct LoopDevice(pub(crate) PathBuf);

impl LoopDevice {
    pub(crate) fn attach(file: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().into())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// The security fields of one `/proc/<pid>/task/<tid>/status`.
#[derive(Debug)]
struct TaskSecurity {
    name: String,
    cap_eff: String,
    no_new_privs: String,
    seccomp: String,
    filters: u32,
}

fn task_security(pid: u32) -> Vec<TaskSecurity> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(text) = std::fs::read_to_string(e.unwrap().path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let field = |f: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{f}:")))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push(TaskSecurity {
            name: field("Name"),
            cap_eff: field("CapEff"),
            no_new_privs: field("NoNewPrivs"),
            seccomp: field("Seccomp"),
            filters: field("Seccomp_filters").parse().unwrap_or(0),
        });
    }
    out
}

/// Every thread: no capabilities, no_new_privs, a seccomp filter; the VM's threads and the
/// DHCP server have a tighter filter stacked on the launcher's. Returns the thread names.
pub(crate) fn assert_all_threads_locked_down(pid: u32) -> Vec<String> {
    let tasks = task_security(pid);
    let main_filters = tasks.iter().map(|t| t.filters).min().unwrap();
    for t in &tasks {
        assert_eq!(t.cap_eff, "0000000000000000", "{t:?}\nall: {tasks:#?}");
        assert_eq!(t.no_new_privs, "1", "{t:?}\nall: {tasks:#?}");
        assert_eq!(t.seccomp, "2", "{t:?}\nall: {tasks:#?}");
        if t.name.starts_with("vcpu") || t.name == "vmm" || t.name == "dhcp-server" {
            assert!(t.filters > main_filters, "{t:?}\nall: {tasks:#?}");
        }
    }
    tasks.into_iter().map(|t| t.name).collect()
}
