//! `kubectl microvirt`: the microvirt kubectl plugin (binary `kubectl-microvirt` on `PATH`; not
//! `kubectl-virt`, which is upstream virtctl's krew name, so both can be installed side by side).
//!
//! - `console|pause|unpause NAME`: `kubectl exec` into the VMI's launcher pod
//!   (`virt-launcher-NAME`, container `compute`) running
//!   `virt-launcher console|pause|unpause --socket /var/run/microvirt/control.sock`.
//! - `snapshot NAME DIR`: the same exec with `virt-launcher snapshot DIR`: the VMI is paused
//!   and snapshotted into DIR, a path inside the launcher pod (a volume of the pod); it stays
//!   paused until `unpause`.
//! - `start|stop|restart NAME`: virtctl's semantics ([`lifecycle`]): the run strategy is
//!   changed only for Halted/Always/Once; Manual and RerunOnFailure VMs, and restarts, get
//!   start/stop requests in the VM's `status.stateChangeRequests`, which the operator carries
//!   out.
//! - `expose TYPE NAME --name SVC`: a Service for a vmi/vm/vmirs/vmpool ([`expose`]).
//!
//! Everything goes through `kubectl` (from `PATH`), so kubeconfig, context and credentials work
//! exactly as for kubectl; `-n/--namespace`, `--kubeconfig` and `--context` are passed on.

use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod expose;
mod lifecycle;

/// The launcher's control socket inside the pod (docs/launcher-pod.md: `/var/run/microvirt`).
const CONTROL_SOCKET: &str = "/var/run/microvirt/control.sock";
/// The launcher pod's container.
const CONTAINER: &str = "compute";

#[derive(Parser, Debug, PartialEq, Eq)]
#[command(
    name = "kubectl microvirt",
    bin_name = "kubectl microvirt",
    about = "Control microvirt VMs and VMIs (console, pause/unpause, snapshot, start/stop/restart, expose)"
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
    /// Start a VM (Halted: runStrategy Always; Manual, RerunOnFailure: a start request).
    Start { name: String },
    /// Stop a VM (Always, Once: runStrategy Halted; Manual, RerunOnFailure: a stop request).
    Stop { name: String },
    /// Restart a VM: a stop and a start request (Always, Manual, RerunOnFailure).
    Restart { name: String },
    /// Create a Service for a VMI, VM, VMI replica set or VM pool (as `virtctl expose`).
    Expose(ExposeArgs),
}

/// `expose`'s arguments (virtctl's flags).
#[derive(clap::Args, Debug, PartialEq, Eq, Clone)]
struct ExposeArgs {
    /// vmi, vm, vmirs or vmpool.
    #[arg(value_parser = expose::Kind::parse)]
    kind: expose::Kind,
    /// Name of the object.
    name: String,
    /// Name of the Service.
    #[arg(long = "name", id = "service_name")]
    service_name: String,
    /// The port the Service serves on (default: the ports the VMI's pod-network interface
    /// declares).
    #[arg(long)]
    port: Option<u16>,
    /// Port number or name on the VMI that traffic goes to (default: --port).
    #[arg(long)]
    target_port: Option<String>,
    /// TCP, UDP or SCTP.
    #[arg(long, default_value = "TCP", value_parser = ["TCP", "UDP", "SCTP"])]
    protocol: String,
    /// Name of the port.
    #[arg(long)]
    port_name: Option<String>,
    /// ClusterIP, NodePort or LoadBalancer.
    #[arg(long = "type", default_value = "ClusterIP",
          value_parser = ["ClusterIP", "NodePort", "LoadBalancer"])]
    service_type: String,
    /// Cluster IP for the Service ("None": headless; default: allocated).
    #[arg(long)]
    cluster_ip: Option<String>,
    /// An external IP the Service also accepts.
    #[arg(long)]
    external_ip: Option<String>,
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

/// Runs kubectl with `input` on stdin, capturing output; an error carries kubectl's stderr.
fn run_capture_stdin(args: &[String], input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = kubectl()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl (is it on PATH?)")?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

fn get_json(global: &[String], resource: &str, name: &str) -> Result<Option<serde_json::Value>> {
    let mut a = global.to_vec();
    a.extend([
        "get".into(),
        format!("{resource}/{name}"),
        "-o".into(),
        "json".into(),
        "--ignore-not-found".into(),
    ]);
    let out = run_capture(&a)?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&out)
        .map(Some)
        .with_context(|| format!("kubectl returned no JSON for {resource}/{name}"))
}

const VM: &str = "virtualmachines.microvirt.io";
const VMI: &str = "virtualmachineinstances.microvirt.io";

/// How often a lifecycle command re-reads the VM after a conflicting change.
const CONFLICT_RETRIES: usize = 5;

/// `start`, `stop` or `restart`: read the VM and its VMI, decide as virtctl does, write with the
/// resourceVersion read (retried on a conflict).
fn lifecycle(
    global: &[String],
    name: &str,
    verb: &str,
    decide: fn(
        &serde_json::Value,
        Option<&serde_json::Value>,
    ) -> std::result::Result<lifecycle::Write, String>,
) -> Result<()> {
    for _ in 0..CONFLICT_RETRIES {
        let vm = get_json(global, VM, name)?
            .with_context(|| format!("virtualmachine {name:?} not found"))?;
        let vmi = get_json(global, VMI, name)?;
        let write = decide(&vm, vmi.as_ref())
            .map_err(|e| anyhow::anyhow!("cannot {verb} VM {name}: {e}"))?;
        let mut a = global.to_vec();
        a.extend([
            "patch".into(),
            format!("{VM}/{name}"),
            "--type=merge".into(),
        ]);
        let patch = match write {
            lifecycle::Write::Spec(p) => p,
            lifecycle::Write::Status(p) => {
                a.push("--subresource=status".into());
                p
            }
        };
        a.extend(["-p".into(), patch.to_string()]);
        match run_capture(&a) {
            Ok(_) => {
                println!("VM {name} was scheduled to {verb}");
                return Ok(());
            }
            Err(e) if e.to_string().contains("(Conflict)") => continue,
            Err(e) => return Err(e),
        }
    }
    bail!("cannot {verb} VM {name}: it kept changing while being updated; try again")
}

fn expose_cmd(global: &[String], args: &ExposeArgs) -> Result<()> {
    let obj = get_json(global, args.kind.resource(), &args.name)?
        .with_context(|| format!("{} {:?} not found", args.kind.resource(), args.name))?;
    let opts = expose::Options {
        name: args.service_name.clone(),
        port: args.port,
        target_port: args.target_port.clone(),
        protocol: args.protocol.clone(),
        port_name: args.port_name.clone(),
        service_type: args.service_type.clone(),
        cluster_ip: args.cluster_ip.clone(),
        external_ip: args.external_ip.clone(),
    };
    let svc = expose::service(args.kind, &obj, &opts).map_err(|e| anyhow::anyhow!(e))?;
    let mut a = global.to_vec();
    a.extend(["create".into(), "-f".into(), "-".into()]);
    run_capture_stdin(&a, &svc.to_string()).context("service creation failed")?;
    println!(
        "Service {} successfully exposed for {} {}",
        args.service_name,
        args.kind.resource().split('.').next().unwrap_or_default(),
        args.name
    );
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
        Cmd::Start { name } => {
            lifecycle(&global, name, "start", lifecycle::start).map(|_| ExitCode::SUCCESS)
        }
        Cmd::Stop { name } => {
            lifecycle(&global, name, "stop", lifecycle::stop).map(|_| ExitCode::SUCCESS)
        }
        Cmd::Restart { name } => {
            lifecycle(&global, name, "restart", lifecycle::restart).map(|_| ExitCode::SUCCESS)
        }
        Cmd::Expose(args) => expose_cmd(&global, args).map(|_| ExitCode::SUCCESS),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kubectl microvirt: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("kubectl-microvirt").chain(args.iter().copied()))
            .unwrap()
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
        assert!(Cli::try_parse_from(["kubectl-microvirt", "pause"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-microvirt", "reboot", "x"]).is_err());
        assert_eq!(
            parse(&["snapshot", "vm1", "/snaps/a"]).cmd,
            Cmd::Snapshot {
                name: "vm1".into(),
                dir: "/snaps/a".into()
            }
        );
        assert!(Cli::try_parse_from(["kubectl-microvirt", "snapshot", "vm1", "rel/a"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-microvirt", "snapshot", "vm1"]).is_err());
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
    fn expose_flags() {
        let c = parse(&[
            "expose", "vm", "db", "--name", "db-svc", "--port", "5432", "--type", "NodePort",
        ]);
        match c.cmd {
            Cmd::Expose(a) => {
                assert_eq!(a.kind, expose::Kind::Vm);
                assert_eq!((a.name.as_str(), a.service_name.as_str()), ("db", "db-svc"));
                assert_eq!(a.port, Some(5432));
                assert_eq!(a.service_type, "NodePort");
                assert_eq!(a.protocol, "TCP");
            }
            other => panic!("{other:?}"),
        }
        // --name is required; unknown kinds and service types are refused.
        for bad in [
            &["expose", "vm", "db", "--port", "1"][..],
            &["expose", "pod", "db", "--name", "s"],
            &["expose", "vm", "db", "--name", "s", "--type", "External"],
        ] {
            assert!(
                Cli::try_parse_from(
                    std::iter::once("kubectl-microvirt").chain(bad.iter().copied())
                )
                .is_err(),
                "{bad:?}"
            );
        }
    }
}
