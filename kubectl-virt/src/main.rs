//! `kubectl virt`: the microvirt kubectl plugin (binary `kubectl-virt` on `PATH`).
//!
//! - `console|pause|unpause NAME`: `kubectl exec` into the VMI's launcher pod
//!   (`virt-launcher-NAME`, container `compute`) running
//!   `virt-launcher console|pause|unpause --socket /var/run/microvirt/control.sock`.
//! - `snapshot NAME DIR`: the same exec with `virt-launcher snapshot DIR`: the VMI is paused
//!   and snapshotted into DIR, a path inside the launcher pod (a volume of the pod); it stays
//!   paused until `unpause`.
//! - `start|stop NAME`: set the VirtualMachine's `spec.runStrategy` to `Always` / `Halted`
//!   (removing the deprecated `spec.running`); the operator creates / deletes the VMI.
//! - `restart NAME`: delete the VM's VMI; the operator creates a new one (run strategies that
//!   recreate: Always, RerunOnFailure).
//!
//! Everything goes through `kubectl` (from `PATH`), so kubeconfig, context and credentials work
//! exactly as for kubectl; `-n/--namespace`, `--kubeconfig` and `--context` are passed on.

use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

/// The launcher's control socket inside the pod (docs/launcher-pod.md: `/var/run/microvirt`).
const CONTROL_SOCKET: &str = "/var/run/microvirt/control.sock";
/// The launcher pod's container.
const CONTAINER: &str = "compute";

#[derive(Parser, Debug, PartialEq, Eq)]
#[command(
    name = "kubectl virt",
    bin_name = "kubectl virt",
    about = "Control microvirt VMs and VMIs (console, pause/unpause, snapshot, start/stop/restart)"
)]
struct Cli {
    /// Namespace of the VM/VMI (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// kubeconfig file (default: kubectl's).
    #[arg(long, global = true)]
    kubeconfig: Option<String>,
    /// kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug, PartialEq, Eq, Clone)]
enum Cmd {
    /// Attach to the VMI's serial console (Ctrl-] detaches).
    Console { name: String },
    /// Pause the VMI's vCPUs.
    Pause { name: String },
    /// Resume a paused VMI.
    Unpause { name: String },
    /// Pause the VMI and write a memory snapshot into DIR (an absolute path inside the launcher
    /// pod); the VMI stays paused until `unpause`.
    Snapshot {
        name: String,
        #[arg(value_parser = absolute_dir)]
        dir: String,
    },
    /// Start a VM: runStrategy Always.
    Start { name: String },
    /// Stop a VM: runStrategy Halted.
    Stop { name: String },
    /// Restart a VM: delete its VMI so the operator makes a new one.
    Restart { name: String },
}

impl Cli {
    /// kubectl's global arguments.
    fn global_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(k) = &self.kubeconfig {
            a.push(format!("--kubeconfig={k}"));
        }
        if let Some(c) = &self.context {
            a.push(format!("--context={c}"));
        }
        if let Some(n) = &self.namespace {
            a.push(format!("--namespace={n}"));
        }
        a
    }
}

fn absolute_dir(s: &str) -> Result<String, String> {
    if s.starts_with('/') {
        Ok(s.to_string())
    } else {
        Err("must be an absolute path inside the launcher pod".into())
    }
}

/// The `kubectl exec` arguments for a launcher control command.
fn exec_args(
    global: &[String],
    name: &str,
    verb: &str,
    interactive: bool,
    tty: bool,
) -> Vec<String> {
    exec_args_with(global, name, verb, &[], interactive, tty)
}

/// [`exec_args`] with arguments after the verb.
fn exec_args_with(
    global: &[String],
    name: &str,
    verb: &str,
    verb_args: &[String],
    interactive: bool,
    tty: bool,
) -> Vec<String> {
    let mut a: Vec<String> = global.to_vec();
    a.push("exec".into());
    if interactive {
        a.push("-i".into());
    }
    if tty {
        a.push("-t".into());
    }
    a.extend([
        format!("virt-launcher-{name}"),
        "-c".into(),
        CONTAINER.into(),
        "--".into(),
        "virt-launcher".into(),
        verb.into(),
    ]);
    a.extend(verb_args.iter().cloned());
    a.extend(["--socket".into(), CONTROL_SOCKET.into()]);
    a
}

/// The merge patch that sets a run strategy (and drops the deprecated `running`, which the
/// CRD forbids next to `runStrategy`).
fn run_strategy_patch(strategy: &str) -> String {
    serde_json::json!({"spec": {"running": null, "runStrategy": strategy}}).to_string()
}

fn kubectl() -> Command {
    Command::new("kubectl")
}

/// Runs kubectl with inherited stdio; its exit status becomes ours.
fn run_inherit(args: &[String]) -> Result<ExitCode> {
    let st = kubectl()
        .args(args)
        .status()
        .context("running kubectl (is it on PATH?)")?;
    Ok(match st.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// Runs kubectl, capturing output; an error carries kubectl's stderr.
fn run_capture(args: &[String]) -> Result<String> {
    let out = kubectl()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running kubectl (is it on PATH?)")?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The VM's effective run strategy (`running` maps to Always/Halted, default Halted).
fn effective_run_strategy(vm: &serde_json::Value) -> String {
    let spec = &vm["spec"];
    if let Some(s) = spec["runStrategy"].as_str() {
        return s.to_string();
    }
    match spec["running"].as_bool() {
        Some(true) => "Always".into(),
        _ => "Halted".into(),
    }
}

fn get_vm(global: &[String], name: &str) -> Result<serde_json::Value> {
    let mut a = global.to_vec();
    a.extend([
        "get".into(),
        format!("virtualmachines.microvirt.io/{name}"),
        "-o".into(),
        "json".into(),
    ]);
    let out = run_capture(&a)?;
    serde_json::from_str(&out).context("kubectl returned no VM JSON")
}

fn set_run_strategy(global: &[String], name: &str, strategy: &str) -> Result<()> {
    let vm = get_vm(global, name)?;
    if effective_run_strategy(&vm) == strategy && vm["spec"]["running"].is_null() {
        println!("VM {name} already has runStrategy {strategy}");
        return Ok(());
    }
    let mut a = global.to_vec();
    a.extend([
        "patch".into(),
        format!("virtualmachines.microvirt.io/{name}"),
        "--type=merge".into(),
        "-p".into(),
        run_strategy_patch(strategy),
    ]);
    run_capture(&a)?;
    println!("VM {name} runStrategy set to {strategy}");
    Ok(())
}

fn restart(global: &[String], name: &str) -> Result<()> {
    let vm = get_vm(global, name)?;
    let strategy = effective_run_strategy(&vm);
    if !matches!(strategy.as_str(), "Always" | "RerunOnFailure") {
        bail!(
            "VM {name} has runStrategy {strategy}; the operator would not recreate its VMI \
             (use `kubectl virt start {name}` first)"
        );
    }
    let mut a = global.to_vec();
    a.extend([
        "delete".into(),
        format!("virtualmachineinstances.microvirt.io/{name}"),
        "--wait=false".into(),
    ]);
    run_capture(&a).with_context(|| format!("VM {name} has no running VMI"))?;
    println!("VM {name} restarting (VMI deleted; the operator creates a new one)");
    Ok(())
}

fn stdin_is_tty() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

fn run(cli: Cli) -> Result<ExitCode> {
    let global = cli.global_args();
    match &cli.cmd {
        Cmd::Console { name } => {
            run_inherit(&exec_args(&global, name, "console", true, stdin_is_tty()))
        }
        Cmd::Pause { name } => run_inherit(&exec_args(&global, name, "pause", false, false)),
        Cmd::Unpause { name } => run_inherit(&exec_args(&global, name, "unpause", false, false)),
        Cmd::Snapshot { name, dir } => run_inherit(&exec_args_with(
            &global,
            name,
            "snapshot",
            std::slice::from_ref(dir),
            false,
            false,
        )),
        Cmd::Start { name } => set_run_strategy(&global, name, "Always").map(|_| ExitCode::SUCCESS),
        Cmd::Stop { name } => set_run_strategy(&global, name, "Halted").map(|_| ExitCode::SUCCESS),
        Cmd::Restart { name } => restart(&global, name).map(|_| ExitCode::SUCCESS),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kubectl virt: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("kubectl-virt").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn flags_anywhere() {
        let a = parse(&["pause", "vm1", "-n", "ns1"]);
        let b = parse(&["-n", "ns1", "pause", "vm1"]);
        assert_eq!(a, b);
        assert_eq!(a.global_args(), vec!["--namespace=ns1"]);
        let c = parse(&[
            "--kubeconfig",
            "/k",
            "--context=ctx",
            "stop",
            "x",
            "--namespace",
            "n",
        ]);
        assert_eq!(
            c.global_args(),
            vec!["--kubeconfig=/k", "--context=ctx", "--namespace=n"]
        );
        assert_eq!(c.cmd, Cmd::Stop { name: "x".into() });
        assert!(Cli::try_parse_from(["kubectl-virt", "pause"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-virt", "reboot", "x"]).is_err());
        assert_eq!(
            parse(&["snapshot", "vm1", "/snaps/a"]).cmd,
            Cmd::Snapshot {
                name: "vm1".into(),
                dir: "/snaps/a".into()
            }
        );
        assert!(Cli::try_parse_from(["kubectl-virt", "snapshot", "vm1", "rel/a"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-virt", "snapshot", "vm1"]).is_err());
    }

    #[test]
    fn exec_command_lines() {
        let g = vec!["--namespace=ns1".to_string()];
        assert_eq!(
            exec_args(&g, "vm1", "pause", false, false).join(" "),
            "--namespace=ns1 exec virt-launcher-vm1 -c compute -- virt-launcher pause --socket /var/run/microvirt/control.sock"
        );
        assert_eq!(
            exec_args(&[], "vm1", "console", true, true).join(" "),
            "exec -i -t virt-launcher-vm1 -c compute -- virt-launcher console --socket /var/run/microvirt/control.sock"
        );
        assert_eq!(
            exec_args_with(&g, "vm1", "snapshot", &["/s/1".into()], false, false).join(" "),
            "--namespace=ns1 exec virt-launcher-vm1 -c compute -- virt-launcher snapshot /s/1 --socket /var/run/microvirt/control.sock"
        );
    }

    #[test]
    fn run_strategies() {
        let v = |j: serde_json::Value| effective_run_strategy(&j);
        assert_eq!(
            v(serde_json::json!({"spec": {"runStrategy": "Manual"}})),
            "Manual"
        );
        assert_eq!(v(serde_json::json!({"spec": {"running": true}})), "Always");
        assert_eq!(v(serde_json::json!({"spec": {"running": false}})), "Halted");
        assert_eq!(v(serde_json::json!({"spec": {}})), "Halted");
        assert_eq!(
            run_strategy_patch("Halted"),
            r#"{"spec":{"runStrategy":"Halted","running":null}}"#
        );
    }
}
