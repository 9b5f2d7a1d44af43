//! `start`, `stop` and `restart` of a VirtualMachine, with virtctl's semantics (pure: what to
//! write, given the VM and its VMI as kubectl prints them in JSON).
//!
//! | runStrategy    | start                          | stop                      | restart            |
//! |----------------|--------------------------------|---------------------------|--------------------|
//! | Halted         | runStrategy Always             | refused: not running      | refused            |
//! | Always         | refused                        | runStrategy Halted        | stop + start request |
//! | Once           | refused                        | runStrategy Halted        | refused            |
//! | Manual         | start request (stop + start if the VMI ended) | stop request | stop + start request |
//! | RerunOnFailure | start request (stop + start if the VMI Succeeded; refused if it Failed) | stop request | stop + start request |
//!
//! The run strategy is written where the VM has it: `spec.runStrategy`, or the deprecated
//! `spec.running` (true / false). Requests go to `status.stateChangeRequests` (the status
//! subresource), which the operator works through (operator/src/vm/plan.rs). Every
//! write carries the resourceVersion that was read, so a concurrent change makes it fail with
//! a conflict instead of being overwritten.

use serde_json::{json, Value};

/// What a lifecycle command writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A merge patch of the VM (its spec).
    Spec(Value),
    /// A merge patch of the VM's status subresource (its `stateChangeRequests`).
    Status(Value),
}

/// The VM's effective run strategy (`running` maps to Always/Halted, default Halted).
pub fn effective_run_strategy(vm: &Value) -> String {
    let spec = &vm["spec"];
    if let Some(s) = spec["runStrategy"].as_str() {
        return s.to_string();
    }
    match spec["running"].as_bool() {
        Some(true) => "Always".into(),
        _ => "Halted".into(),
    }
}

fn phase(vmi: &Value) -> &str {
    vmi["status"]["phase"].as_str().unwrap_or("")
}

fn is_final(vmi: &Value) -> bool {
    matches!(phase(vmi), "Succeeded" | "Failed")
}

fn uid(vmi: &Value) -> &str {
    vmi["metadata"]["uid"].as_str().unwrap_or("")
}

fn resource_version(vm: &Value) -> Value {
    vm["metadata"]["resourceVersion"].clone()
}

fn start_request() -> Value {
    json!({"action": "Start"})
}

fn stop_request(vmi: &Value) -> Value {
    json!({"action": "Stop", "uid": uid(vmi)})
}

/// The spec patch that sets the strategy to Always (`start`) or Halted (`stop`), in the field
/// the VM uses.
fn run_patch(vm: &Value, running: bool) -> Write {
    let spec = if vm["spec"]["runStrategy"].is_string() || vm["spec"]["running"].is_null() {
        json!({"runStrategy": if running { "Always" } else { "Halted" }})
    } else {
        json!({"running": running})
    };
    Write::Spec(json!({
        "metadata": {"resourceVersion": resource_version(vm)},
        "spec": spec,
    }))
}

/// The status patch that adds `new` requests: to an empty list; a lone stop request replaces
/// what is pending (KubeVirt's rule); anything else waits for the pending requests.
fn requests_patch(vm: &Value, new: Vec<Value>) -> Result<Write, String> {
    let pending = vm["status"]["stateChangeRequests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let lone_stop = new.len() == 1 && new[0]["action"] == "Stop";
    if !pending.is_empty() && !lone_stop {
        return Err(format!(
            "unable to complete request: stop/start already underway ({} pending in \
             status.stateChangeRequests)",
            pending.len()
        ));
    }
    Ok(Write::Status(json!({
        "metadata": {"resourceVersion": resource_version(vm)},
        "status": {"stateChangeRequests": new},
    })))
}

/// `start`: what to write, or why not.
pub fn start(vm: &Value, vmi: Option<&Value>) -> Result<Write, String> {
    if let Some(v) = vmi {
        if !is_final(v) && !matches!(phase(v), "" | "Unknown") {
            return Err("VM is already running".into());
        }
    }
    let strategy = effective_run_strategy(vm);
    match strategy.as_str() {
        "Halted" => Ok(run_patch(vm, true)),
        "RerunOnFailure" | "Manual" => {
            let ended = match (strategy.as_str(), vmi) {
                ("RerunOnFailure", Some(v)) if phase(v) == "Failed" => {
                    return Err(
                        "RerunOnFailure does not support starting VM from failed state".into(),
                    )
                }
                ("RerunOnFailure", Some(v)) => phase(v) == "Succeeded",
                (_, Some(v)) => is_final(v),
                (_, None) => false,
            };
            match vmi {
                Some(v) if ended => requests_patch(vm, vec![stop_request(v), start_request()]),
                _ => requests_patch(vm, vec![start_request()]),
            }
        }
        other => Err(format!("{other} does not support manual start requests")),
    }
}

/// `stop`: what to write, or why not.
pub fn stop(vm: &Value, vmi: Option<&Value>) -> Result<Write, String> {
    let strategy = effective_run_strategy(vm);
    let running = vmi.filter(|v| !is_final(v));
    match (strategy.as_str(), running) {
        ("Halted", None) | ("RerunOnFailure" | "Manual", None) => Err("VM is not running".into()),
        ("Halted", Some(_)) => {
            Err("VM has runStrategy Halted: its VMI is already being stopped".into())
        }
        ("RerunOnFailure" | "Manual", Some(v)) => requests_patch(vm, vec![stop_request(v)]),
        _ => Ok(run_patch(vm, false)),
    }
}

/// `restart`: what to write, or why not.
pub fn restart(vm: &Value, vmi: Option<&Value>) -> Result<Write, String> {
    let strategy = effective_run_strategy(vm);
    if matches!(strategy.as_str(), "Halted" | "Once") {
        return Err(format!(
            "RunStrategy {strategy} does not support manual restart requests"
        ));
    }
    let Some(v) = vmi else {
        return Err("VM is not running".into());
    };
    requests_patch(vm, vec![stop_request(v), start_request()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(spec: Value) -> Value {
        json!({"metadata": {"name": "vm1", "resourceVersion": "42"}, "spec": spec})
    }

    fn vmi(phase: &str) -> Value {
        json!({"metadata": {"uid": "u1"}, "status": {"phase": phase}})
    }

    fn requests(w: Result<Write, String>) -> Value {
        match w {
            Ok(Write::Status(p)) => {
                assert_eq!(p["metadata"]["resourceVersion"], "42");
                p["status"]["stateChangeRequests"].clone()
            }
            other => panic!("not a status write: {other:?}"),
        }
    }

    fn spec(w: Result<Write, String>) -> Value {
        match w {
            Ok(Write::Spec(p)) => {
                assert_eq!(p["metadata"]["resourceVersion"], "42");
                p["spec"].clone()
            }
            other => panic!("not a spec write: {other:?}"),
        }
    }

    #[test]
    fn effective_strategy() {
        let v = |j: Value| effective_run_strategy(&vm(j));
        assert_eq!(v(json!({"runStrategy": "Manual"})), "Manual");
        assert_eq!(v(json!({"running": true})), "Always");
        assert_eq!(v(json!({"running": false})), "Halted");
        assert_eq!(v(json!({})), "Halted");
    }

    #[test]
    fn start_as_virtctl() {
        let halted = vm(json!({"runStrategy": "Halted"}));
        assert_eq!(spec(start(&halted, None)), json!({"runStrategy": "Always"}));
        // The deprecated field stays the one that is written.
        let old = vm(json!({"running": false}));
        assert_eq!(spec(start(&old, None)), json!({"running": true}));
        let manual = vm(json!({"runStrategy": "Manual"}));
        assert_eq!(requests(start(&manual, None)), json!([{"action": "Start"}]));
        // An ended VMI is stopped (deleted) first.
        for p in ["Succeeded", "Failed"] {
            assert_eq!(
                requests(start(&manual, Some(&vmi(p)))),
                json!([{"action": "Stop", "uid": "u1"}, {"action": "Start"}])
            );
        }
        assert_eq!(
            start(&manual, Some(&vmi("Running"))),
            Err("VM is already running".into())
        );
        // A VMI without a phase yet, or Unknown, does not count as running.
        assert_eq!(
            requests(start(&manual, Some(&vmi("")))),
            json!([{"action": "Start"}])
        );
        let rerun = vm(json!({"runStrategy": "RerunOnFailure"}));
        assert_eq!(
            requests(start(&rerun, Some(&vmi("Succeeded")))),
            json!([{"action": "Stop", "uid": "u1"}, {"action": "Start"}])
        );
        assert!(start(&rerun, Some(&vmi("Failed")))
            .unwrap_err()
            .contains("does not support starting VM from failed state"));
        for s in ["Always", "Once"] {
            assert_eq!(
                start(&vm(json!({"runStrategy": s})), None),
                Err(format!("{s} does not support manual start requests"))
            );
        }
        assert_eq!(
            start(&vm(json!({"running": true})), None),
            Err("Always does not support manual start requests".into())
        );
    }

    #[test]
    fn stop_as_virtctl() {
        for s in ["Always", "Once"] {
            assert_eq!(
                spec(stop(&vm(json!({"runStrategy": s})), Some(&vmi("Running")))),
                json!({"runStrategy": "Halted"})
            );
        }
        assert_eq!(
            spec(stop(&vm(json!({"running": true})), None)),
            json!({"running": false})
        );
        for s in ["Manual", "RerunOnFailure"] {
            let m = vm(json!({"runStrategy": s}));
            assert_eq!(
                requests(stop(&m, Some(&vmi("Running")))),
                json!([{"action": "Stop", "uid": "u1"}])
            );
            assert_eq!(stop(&m, None), Err("VM is not running".into()));
            assert_eq!(
                stop(&m, Some(&vmi("Succeeded"))),
                Err("VM is not running".into())
            );
        }
        let halted = vm(json!({"runStrategy": "Halted"}));
        assert_eq!(stop(&halted, None), Err("VM is not running".into()));
        assert!(stop(&halted, Some(&vmi("Running"))).is_err());
    }

    #[test]
    fn restart_as_virtctl() {
        for s in ["Always", "Manual", "RerunOnFailure"] {
            assert_eq!(
                requests(restart(
                    &vm(json!({"runStrategy": s})),
                    Some(&vmi("Running"))
                )),
                json!([{"action": "Stop", "uid": "u1"}, {"action": "Start"}])
            );
            assert_eq!(
                restart(&vm(json!({"runStrategy": s})), None),
                Err("VM is not running".into())
            );
        }
        for s in ["Halted", "Once"] {
            assert_eq!(
                restart(&vm(json!({"runStrategy": s})), Some(&vmi("Running"))),
                Err(format!(
                    "RunStrategy {s} does not support manual restart requests"
                ))
            );
        }
    }

    #[test]
    fn pending_requests() {
        let mut m = vm(json!({"runStrategy": "Manual"}));
        m["status"] = json!({"stateChangeRequests": [{"action": "Start"}]});
        // A lone stop replaces pending requests; anything else waits.
        assert_eq!(
            requests(stop(&m, Some(&vmi("Running")))),
            json!([{"action": "Stop", "uid": "u1"}])
        );
        assert!(restart(&m, Some(&vmi("Running")))
            .unwrap_err()
            .contains("already underway"));
        assert!(start(&m, None).unwrap_err().contains("already underway"));
    }
}
