//! `kubectl`, as a user would run it, with small helpers for the tests: JSON gets, applies
//! from strings, waiting, and throw-away namespaces.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// `kubectl` with a fixed kubeconfig.
#[derive(Debug, Clone)]
pub struct Kubectl {
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// Uses `kubeconfig` for every call.
    pub fn new(kubeconfig: &Path) -> Self {
        Self {
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// The kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A `kubectl` command with the kubeconfig set.
    pub fn command(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        c
    }

    /// Runs `kubectl args` (with `stdin`, if given); returns (success, stdout, stderr).
    pub fn try_run(&self, args: &[&str], stdin: Option<&str>) -> Result<(bool, String, String)> {
        let mut c = self.command();
        c.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().context("running kubectl")?;
        if let (Some(input), Some(mut s)) = (stdin, child.stdin.take()) {
            s.write_all(input.as_bytes())
                .context("writing to kubectl")?;
        }
        let out = child.wait_with_output().context("waiting for kubectl")?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// Runs `kubectl args`; an error carries kubectl's stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let (ok, out, err) = self.try_run(args, None)?;
        if !ok {
            bail!("kubectl {}: {}", args.join(" "), err.trim());
        }
        Ok(out)
    }

    /// `kubectl apply -f -` of `yaml` in namespace `ns`.
    pub fn apply(&self, ns: &str, yaml: &str) -> Result<String> {
        let (ok, out, err) = self.try_run(&["-n", ns, "apply", "-f", "-"], Some(yaml))?;
        if !ok {
            bail!("kubectl apply: {}\n{yaml}", err.trim());
        }
        Ok(out)
    }

    /// `kubectl get KIND NAME -o json`; `None` when it does not exist.
    pub fn get(&self, ns: &str, kind: &str, name: &str) -> Result<Option<Value>> {
        let (ok, out, err) = self.try_run(&["-n", ns, "get", kind, name, "-o", "json"], None)?;
        if !ok {
            if err.contains("NotFound") || err.contains("not found") {
                return Ok(None);
            }
            bail!("kubectl get {kind} {name}: {}", err.trim());
        }
        Ok(Some(serde_json::from_str(&out)?))
    }

    /// `kubectl get KIND -o json` (optionally with a label selector): the items.
    pub fn list(&self, ns: &str, kind: &str, selector: Option<&str>) -> Result<Vec<Value>> {
        let mut args = vec!["-n", ns, "get", kind, "-o", "json"];
        if let Some(s) = selector {
            args.extend(["-l", s]);
        }
        let v: Value = serde_json::from_str(&self.run(&args)?)?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }
}

/// Polls `f` every 200 ms until it returns `Some`, or fails after `timeout` with `what` and
/// the last observation `f` recorded in `last`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut(&mut String) -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        match f(&mut last) {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if start.elapsed() > timeout {
            return Err(anyhow!(
                "timed out after {:?} waiting for {what}; last seen: {last}",
                timeout
            ));
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// A namespace for one test, deleted (without waiting) when dropped.
pub struct TestNamespace {
    kubectl: Kubectl,
    name: String,
}

impl TestNamespace {
    /// Creates namespace `name` and waits for its `default` ServiceAccount (the ServiceAccount
    /// admission plugin refuses pods until the controller-manager has made it).
    pub fn create(kubectl: &Kubectl, name: &str) -> Result<Self> {
        kubectl.run(&["create", "namespace", name])?;
        let ns = Self {
            kubectl: kubectl.clone(),
            name: name.to_string(),
        };
        wait_for(
            &format!("ServiceAccount {name}/default"),
            Duration::from_secs(60),
            |_| Ok(kubectl.get(name, "serviceaccount", "default")?.map(|_| ())),
        )?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = self
            .kubectl
            .try_run(&["delete", "namespace", &self.name, "--wait=false"], None);
    }
}

/// The value of condition `type` in an object's `status.conditions`.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether condition `type` is `True`.
pub fn condition_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}
