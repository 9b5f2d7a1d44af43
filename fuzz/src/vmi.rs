//! `vmi_document`: the launcher's VMI document parser ([`VmiDocument::parse`], JSON when the
//! text starts with `{`, YAML otherwise) and the values it derives.
//!
//! Two kinds of input, picked by the first byte:
//! - raw text: any bytes as a manifest. The parser must answer with a document or an error
//!   (no panic, no hang, no stack overflow on deep nesting), and on a document the derived
//!   values must hold: vCPUs are the product of cores × sockets × threads (each defaulting
//!   to one) without wrapping around, the grace period is the given one clamped at 0 (default
//!   30), memory is an error or a number, never a panic;
//! - a generated manifest: a document tree with every field the launcher reads (strings full
//!   of YAML-significant characters, words YAML gives meaning to such as `yes`, `null`, `0x10`,
//!   numbers at their limits, quantities as strings and bare numbers, nested lists), written
//!   once as JSON and once as YAML (block or flow style). Both texts must parse, to the same
//!   document, holding exactly the values written: what the operator (JSON) or a user (YAML)
//!   wrote is what the launcher acts on.
//!
//! Every `containerRootfs` volume of a parsed document is resolved into the workload the guest's
//! init runs (docs/oci-images.md), against an empty image configuration and, for raw text, the
//! same bytes read as an OCI image configuration: an error, or a workload with a program, an
//! absolute working directory, `PATH`, one value per variable, no NUL byte, that reads back
//! from its JSON unchanged.

use launcher::vmi::VmiDocument;
use serde_json::{json, Map, Value};

use crate::input::Input;

/// Words and shapes YAML gives meaning to when unquoted.
const TRICKY: &[&str] = &[
    "",
    " ",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "true",
    "False",
    "null",
    "~",
    "NULL",
    "0x10",
    "010",
    "1e3",
    ".inf",
    "-.nan",
    "12:30",
    "- a",
    "a: b",
    "#x",
    "!tag",
    "&a",
    "*a",
    "|",
    ">",
    "'",
    "\"",
    "\\",
    "{}",
    "[]",
    "%",
    "@",
    "`",
    "\t",
    "\n",
    "a\nb",
    " lead",
    "trail ",
    "é…",
    "\u{1F600}",
    "\u{0}",
    "\u{7f}",
    "\u{85}",
    "\u{2028}",
    "\u{feff}x",
    "---",
    "...",
    "? k",
];

fn string(inp: &mut Input) -> String {
    match inp.u8() % 4 {
        0 => TRICKY[usize::from(inp.u8()) % TRICKY.len()].to_string(),
        1 => {
            let n = usize::from(inp.u8() % 12) + 1;
            (0..n).map(|_| (b'a' + inp.u8() % 26) as char).collect()
        }
        _ => {
            let n = usize::from(inp.u8() % 24);
            let mut s = String::new();
            for _ in 0..n {
                let c = match inp.u8() % 8 {
                    0..=3 => (b'a' + inp.u8() % 26) as char,
                    4 => (b"0123456789"[usize::from(inp.u8() % 10)]) as char,
                    5 => (b" :#-'\"\\{}[],&*!|>%@`?"[usize::from(inp.u8() % 21)]) as char,
                    6 => ['\n', '\t', '\r', 'é', '…', '\u{1F600}', '\u{0}', '\u{1b}']
                        [usize::from(inp.u8() % 8)],
                    _ => char::from_u32(u32::from(inp.u16())).unwrap_or('x'),
                };
                s.push(c);
            }
            s
        }
    }
}

fn quantity(inp: &mut Input) -> Value {
    let suffixes = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "K", "M", "G", "T", "P", "E", "m", "Qi",
    ];
    match inp.u8() % 4 {
        0 => json!(inp.u64() >> (inp.u8() % 64)),
        1 => Value::String(string(inp)),
        _ => {
            let n = match inp.u8() % 4 {
                0 => u64::from(inp.u8()),
                1 => u64::from(inp.u32()),
                _ => inp.u64(),
            };
            let s = suffixes[usize::from(inp.u8()) % suffixes.len()];
            Value::String(format!("{n}{s}"))
        }
    }
}

/// Some fields are left out, so defaults are exercised as well.
fn maybe(
    inp: &mut Input,
    m: &mut Map<String, Value>,
    key: &str,
    v: impl FnOnce(&mut Input) -> Value,
) {
    if !inp.u8().is_multiple_of(4) {
        let v = v(inp);
        m.insert(key.to_string(), v);
    }
}

fn obj(pairs: Map<String, Value>) -> Value {
    Value::Object(pairs)
}

fn document(inp: &mut Input) -> Value {
    let mut meta = Map::new();
    maybe(inp, &mut meta, "name", |i| Value::String(string(i)));
    maybe(inp, &mut meta, "namespace", |i| Value::String(string(i)));
    maybe(inp, &mut meta, "uid", |i| Value::String(string(i)));
    let mut domain = Map::new();
    maybe(inp, &mut domain, "cpu", |i| {
        let mut c = Map::new();
        for k in ["cores", "sockets", "threads"] {
            maybe(i, &mut c, k, |i| match i.u8() % 4 {
                0 => json!(u32::MAX - u32::from(i.u8() % 2)),
                1 => json!(0),
                _ => json!(1 + u32::from(i.u8() % 8)),
            });
        }
        obj(c)
    });
    maybe(inp, &mut domain, "memory", |i| {
        let mut m = Map::new();
        maybe(i, &mut m, "guest", quantity);
        obj(m)
    });
    maybe(inp, &mut domain, "resources", |i| {
        let mut r = Map::new();
        let mut req = Map::new();
        maybe(i, &mut req, "memory", quantity);
        maybe(i, &mut req, "cpu", quantity);
        r.insert("requests".into(), obj(req));
        obj(r)
    });
    maybe(inp, &mut domain, "firmware", |i| {
        let mut kb = Map::new();
        maybe(i, &mut kb, "kernelArgs", |i| Value::String(string(i)));
        maybe(i, &mut kb, "container", |i| {
            let mut c = Map::new();
            maybe(i, &mut c, "image", |i| Value::String(string(i)));
            maybe(i, &mut c, "kernelPath", |i| Value::String(string(i)));
            maybe(i, &mut c, "initrdPath", |i| Value::String(string(i)));
            obj(c)
        });
        json!({ "kernelBoot": obj(kb) })
    });
    let mut devices = Map::new();
    let disks: Vec<Value> = (0..inp.u8() % 4)
        .map(|_| {
            let mut d = Map::new();
            d.insert("name".into(), Value::String(string(inp)));
            maybe(inp, &mut d, "serial", |i| Value::String(string(i)));
            maybe(inp, &mut d, "disk", |i| {
                let mut t = Map::new();
                maybe(i, &mut t, "bus", |i| Value::String(string(i)));
                maybe(i, &mut t, "readonly", |i| Value::Bool(i.bool()));
                obj(t)
            });
            obj(d)
        })
        .collect();
    devices.insert("disks".into(), Value::Array(disks));
    let interfaces: Vec<Value> = (0..inp.u8() % 3)
        .map(|_| {
            let mut d = Map::new();
            d.insert("name".into(), Value::String(string(inp)));
            let binding = if inp.bool() { "masquerade" } else { "bridge" };
            d.insert(binding.into(), json!({}));
            maybe(inp, &mut d, "macAddress", |i| Value::String(string(i)));
            let ports: Vec<Value> = (0..inp.u8() % 3)
                .map(|_| {
                    let mut p = Map::new();
                    maybe(inp, &mut p, "protocol", |i| Value::String(string(i)));
                    p.insert("port".into(), json!(inp.u32() as i32));
                    obj(p)
                })
                .collect();
            d.insert("ports".into(), Value::Array(ports));
            obj(d)
        })
        .collect();
    devices.insert("interfaces".into(), Value::Array(interfaces));
    domain.insert("devices".into(), obj(devices));
    let volumes: Vec<Value> = (0..inp.u8() % 5)
        .map(|_| {
            let mut v = Map::new();
            v.insert("name".into(), Value::String(string(inp)));
            match inp.u8() % 5 {
                0 => {
                    let mut c = Map::new();
                    maybe(inp, &mut c, "image", |i| Value::String(string(i)));
                    maybe(inp, &mut c, "path", |i| Value::String(string(i)));
                    v.insert("containerDisk".into(), obj(c));
                }
                4 => {
                    let mut c = Map::new();
                    maybe(inp, &mut c, "image", |i| Value::String(string(i)));
                    maybe(inp, &mut c, "path", |i| Value::String(string(i)));
                    let strings = |i: &mut Input| {
                        Value::Array((0..i.u8() % 4).map(|_| Value::String(string(i))).collect())
                    };
                    maybe(inp, &mut c, "command", strings);
                    maybe(inp, &mut c, "args", strings);
                    maybe(inp, &mut c, "workingDir", |i| Value::String(string(i)));
                    let env: Vec<Value> = (0..inp.u8() % 4)
                        .map(|_| json!({ "name": string(inp), "value": string(inp) }))
                        .collect();
                    c.insert("env".into(), Value::Array(env));
                    v.insert("containerRootfs".into(), obj(c));
                }
                1 => {
                    let mut c = Map::new();
                    c.insert("claimName".into(), Value::String(string(inp)));
                    maybe(inp, &mut c, "readOnly", |i| Value::Bool(i.bool()));
                    v.insert("persistentVolumeClaim".into(), obj(c));
                }
                2 => {
                    v.insert("emptyDisk".into(), json!({ "capacity": quantity(inp) }));
                }
                _ => {
                    let mut c = Map::new();
                    maybe(inp, &mut c, "userData", |i| Value::String(string(i)));
                    maybe(inp, &mut c, "userDataBase64", |i| Value::String(string(i)));
                    maybe(inp, &mut c, "networkData", |i| Value::String(string(i)));
                    v.insert("cloudInitNoCloud".into(), obj(c));
                }
            }
            obj(v)
        })
        .collect();
    let networks: Vec<Value> = (0..inp.u8() % 3)
        .map(|_| json!({ "name": string(inp), "pod": {} }))
        .collect();
    let mut spec = Map::new();
    spec.insert("domain".into(), obj(domain));
    spec.insert("volumes".into(), Value::Array(volumes));
    spec.insert("networks".into(), Value::Array(networks));
    maybe(
        inp,
        &mut spec,
        "terminationGracePeriodSeconds",
        |i| match i.u8() % 4 {
            0 => json!(i64::MIN + i64::from(i.u8())),
            1 => json!(i64::MAX - i64::from(i.u8())),
            _ => json!(i64::from(i.u16()) - 100),
        },
    );
    let mut doc = Map::new();
    doc.insert("apiVersion".into(), json!("microvirt.io/v1alpha1"));
    doc.insert("kind".into(), json!("VirtualMachineInstance"));
    doc.insert("metadata".into(), obj(meta));
    doc.insert("spec".into(), obj(spec));
    maybe(inp, &mut doc, "guestMemoryBytes", |i| json!(i.u64()));
    maybe(inp, &mut doc, "vcpus", |i| json!(u64::from(i.u16())));
    obj(doc)
}

/// Characters a YAML stream may contain as they are (YAML 1.2, 5.1).
fn yaml_printable(c: char) -> bool {
    matches!(c as u32, 0x9 | 0xa | 0xd | 0x20..=0x7e | 0x85 | 0xa0..=0xd7ff | 0xe000..=0xfffd | 0x10000..=0x10ffff)
}

/// A YAML double-quoted scalar.
fn quoted(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\x{:02x}", c as u32)),
            c if !yaml_printable(c)
                || matches!(c, '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}') =>
            {
                o.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => quoted(s),
        other => other.to_string(),
    }
}

fn yaml_block(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                out.push_str(&format!("{pad}{k}:"));
                match v {
                    Value::Object(x) if !x.is_empty() => {
                        out.push('\n');
                        yaml_block(v, indent + 2, out);
                    }
                    Value::Array(x) if !x.is_empty() => {
                        out.push('\n');
                        yaml_block(v, indent, out);
                    }
                    Value::Object(_) => out.push_str(" {}\n"),
                    Value::Array(_) => out.push_str(" []\n"),
                    s => out.push_str(&format!(" {}\n", scalar(s))),
                }
            }
        }
        Value::Array(a) => {
            for item in a {
                match item {
                    Value::Object(x) if !x.is_empty() => {
                        out.push_str(&format!("{pad}-\n"));
                        yaml_block(item, indent + 2, out);
                    }
                    other => {
                        out.push_str(&format!("{pad}- "));
                        yaml_flow(other, out);
                        out.push('\n');
                    }
                }
            }
        }
        s => out.push_str(&format!("{pad}{}\n", scalar(s))),
    }
}

fn yaml_flow(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            out.push('{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                yaml_flow(v, out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                yaml_flow(v, out);
            }
            out.push(']');
        }
        s => out.push_str(&scalar(s)),
    }
}

fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    get(v, path).and_then(Value::as_str)
}

/// What a `containerRootfs` volume runs (docs/oci-images.md), resolved against `image`: an
/// error, or a workload that the guest's init can run as it is.
fn workload_holds(doc: &VmiDocument, image: &launcher::oci::ImageConfig) {
    for v in &doc.spec.volumes {
        let Some(cr) = &v.container_rootfs else {
            continue;
        };
        let Ok(w) = launcher::oci::workload(image, cr, "/dev/vda", doc.hostname()) else {
            continue;
        };
        assert!(!w.argv.is_empty() && !w.argv[0].is_empty(), "{w:?}");
        assert!(w.working_dir.starts_with('/'), "{w:?}");
        assert!(w.env.iter().any(|e| e.name == "PATH"), "{w:?}");
        let mut names: Vec<&str> = w.env.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "one value per variable: {w:?}");
        let strings = w
            .argv
            .iter()
            .chain([&w.working_dir])
            .chain(w.env.iter().flat_map(|e| [&e.name, &e.value]));
        for s in strings {
            assert!(!s.contains('\0'), "NUL in {w:?}");
        }
        assert!(w
            .env
            .iter()
            .all(|e| !e.name.is_empty() && !e.name.contains('=')));
        // The init reads it back as the launcher wrote it.
        let back: launcher::oci::Workload =
            serde_json::from_slice(&serde_json::to_vec(&w).expect("JSON")).expect("parses");
        assert_eq!(back, w);
    }
}

/// Check the derived values every parsed document must satisfy.
fn derived(doc: &VmiDocument) {
    workload_holds(doc, &launcher::oci::ImageConfig::default());
    let cpu = doc.spec.domain.cpu.clone().unwrap_or_default();
    let product = [cpu.cores, cpu.sockets, cpu.threads]
        .iter()
        .map(|v| u128::from(v.unwrap_or(1)))
        .product::<u128>();
    let vcpus = doc.vcpus();
    let topology = doc
        .spec
        .domain
        .cpu
        .as_ref()
        .is_some_and(|c| c.cores.is_some() || c.sockets.is_some() || c.threads.is_some());
    match doc.vcpus {
        Some(v) => assert_eq!(vcpus.ok(), Some(v), "the operator's vcpus win"),
        None if topology => {
            let vcpus = vcpus.expect("a topology always gives a vCPU count");
            assert!(
                u128::from(vcpus) == product
                    || (product > u128::from(u64::MAX) && vcpus == u64::MAX),
                "vCPUs {vcpus} for cores × sockets × threads = {product}"
            )
        }
        None => {
            // KubeVirt's rule without a topology: the CPU limit, else the CPU request, else 1.
            let res = doc.spec.domain.resources.as_ref();
            let q = res
                .and_then(|r| r.limits.as_ref())
                .and_then(|m| m.get("cpu"))
                .or_else(|| {
                    res.and_then(|r| r.requests.as_ref())
                        .and_then(|m| m.get("cpu"))
                });
            match q {
                None => assert_eq!(vcpus.ok(), Some(1), "default vCPUs"),
                Some(q) => assert_eq!(
                    vcpus.ok(),
                    q.bytes("cpu").ok().map(|n| n.max(1)),
                    "vCPUs from the CPU quantity {:?}",
                    q.0
                ),
            }
        }
    }
    let grace = doc.grace_period_seconds();
    match doc.spec.termination_grace_period_seconds {
        Some(g) => assert_eq!(grace, g.max(0) as u64, "grace period"),
        None => assert_eq!(grace, 30, "default grace period"),
    }
    let _ = doc.guest_memory_bytes();
    for v in &doc.spec.volumes {
        if let Some(e) = &v.empty_disk {
            let _ = e.capacity.bytes("emptyDisk.capacity");
        }
    }
    let _ = doc.name();
    let _ = doc.kernel_boot();
}

/// The parsed document holds the generated values.
fn matches(doc: &VmiDocument, v: &Value, how: &str) {
    assert_eq!(doc.kind.as_deref(), s(v, &["kind"]), "{how}: kind");
    for (field, got) in [
        ("name", &doc.metadata.name),
        ("namespace", &doc.metadata.namespace),
        ("uid", &doc.metadata.uid),
    ] {
        assert_eq!(
            got.as_deref(),
            s(v, &["metadata", field]),
            "{how}: metadata.{field}"
        );
    }
    let d = &doc.spec.domain;
    let num = |p: &[&str]| get(v, p).and_then(Value::as_u64);
    let cpu = d.cpu.clone().unwrap_or_default();
    assert_eq!(
        cpu.cores.map(u64::from),
        num(&["spec", "domain", "cpu", "cores"]),
        "{how}: cores"
    );
    assert_eq!(
        cpu.sockets.map(u64::from),
        num(&["spec", "domain", "cpu", "sockets"]),
        "{how}: sockets"
    );
    assert_eq!(
        cpu.threads.map(u64::from),
        num(&["spec", "domain", "cpu", "threads"]),
        "{how}: threads"
    );
    let qstr = |q: &Value| match q {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    assert_eq!(
        d.memory
            .as_ref()
            .and_then(|m| m.guest.as_ref())
            .map(|q| q.0.clone()),
        get(v, &["spec", "domain", "memory", "guest"]).map(qstr),
        "{how}: memory.guest"
    );
    let kb = doc.kernel_boot();
    assert_eq!(
        kb.and_then(|k| k.kernel_args.as_deref()),
        s(
            v,
            &["spec", "domain", "firmware", "kernelBoot", "kernelArgs"]
        ),
        "{how}: kernelArgs"
    );
    let c = kb.and_then(|k| k.container.as_ref());
    for (field, got) in [
        ("image", c.and_then(|c| c.image.as_deref())),
        ("kernelPath", c.and_then(|c| c.kernel_path.as_deref())),
        ("initrdPath", c.and_then(|c| c.initrd_path.as_deref())),
    ] {
        assert_eq!(
            got,
            s(
                v,
                &[
                    "spec",
                    "domain",
                    "firmware",
                    "kernelBoot",
                    "container",
                    field
                ]
            ),
            "{how}: kernelBoot.container.{field}"
        );
    }
    let disks = get(v, &["spec", "domain", "devices", "disks"]).and_then(Value::as_array);
    assert_eq!(
        d.devices.disks.len(),
        disks.map_or(0, Vec::len),
        "{how}: disk count"
    );
    for (disk, want) in d.devices.disks.iter().zip(disks.into_iter().flatten()) {
        assert_eq!(
            Some(disk.name.as_str()),
            s(want, &["name"]),
            "{how}: disk name"
        );
        assert_eq!(
            disk.serial.as_deref(),
            s(want, &["serial"]),
            "{how}: disk serial"
        );
        let t = disk.disk.as_ref();
        assert_eq!(
            t.and_then(|t| t.bus.as_deref()),
            s(want, &["disk", "bus"]),
            "{how}: bus"
        );
        assert_eq!(
            t.and_then(|t| t.readonly),
            get(want, &["disk", "readonly"]).and_then(Value::as_bool),
            "{how}: readonly"
        );
    }
    let ifaces = get(v, &["spec", "domain", "devices", "interfaces"]).and_then(Value::as_array);
    assert_eq!(
        d.devices.interfaces.len(),
        ifaces.map_or(0, Vec::len),
        "{how}: interface count"
    );
    for (i, want) in d
        .devices
        .interfaces
        .iter()
        .zip(ifaces.into_iter().flatten())
    {
        assert_eq!(
            Some(i.name.as_str()),
            s(want, &["name"]),
            "{how}: interface name"
        );
        assert_eq!(
            i.masquerade.is_some(),
            want.get("masquerade").is_some(),
            "{how}: masquerade"
        );
        assert_eq!(
            i.bridge.is_some(),
            want.get("bridge").is_some(),
            "{how}: bridge"
        );
        assert_eq!(
            i.mac_address.as_deref(),
            s(want, &["macAddress"]),
            "{how}: macAddress"
        );
        let ports = want.get("ports").and_then(Value::as_array);
        assert_eq!(
            i.ports.len(),
            ports.map_or(0, Vec::len),
            "{how}: port count"
        );
        for (p, w) in i.ports.iter().zip(ports.into_iter().flatten()) {
            assert_eq!(
                p.protocol.as_deref(),
                s(w, &["protocol"]),
                "{how}: protocol"
            );
            assert_eq!(
                Some(i64::from(p.port)),
                w.get("port").and_then(Value::as_i64),
                "{how}: port"
            );
        }
    }
    let vols = get(v, &["spec", "volumes"]).and_then(Value::as_array);
    assert_eq!(
        doc.spec.volumes.len(),
        vols.map_or(0, Vec::len),
        "{how}: volume count"
    );
    for (vol, w) in doc.spec.volumes.iter().zip(vols.into_iter().flatten()) {
        assert_eq!(
            Some(vol.name.as_str()),
            s(w, &["name"]),
            "{how}: volume name"
        );
        let cd = vol.container_disk.as_ref();
        assert_eq!(
            cd.is_some(),
            w.get("containerDisk").is_some(),
            "{how}: containerDisk"
        );
        assert_eq!(
            cd.and_then(|c| c.image.as_deref()),
            s(w, &["containerDisk", "image"]),
            "{how}: image"
        );
        assert_eq!(
            cd.and_then(|c| c.path.as_deref()),
            s(w, &["containerDisk", "path"]),
            "{how}: path"
        );
        let cr = vol.container_rootfs.as_ref();
        assert_eq!(
            cr.is_some(),
            w.get("containerRootfs").is_some(),
            "{how}: containerRootfs"
        );
        let list = |l: Option<&Vec<String>>| l.map(|l| json!(l));
        if let Some(cr) = cr {
            assert_eq!(
                list(cr.command.as_ref()).as_ref(),
                get(w, &["containerRootfs", "command"]),
                "{how}: command"
            );
            assert_eq!(
                list(cr.args.as_ref()).as_ref(),
                get(w, &["containerRootfs", "args"]),
                "{how}: args"
            );
            assert_eq!(
                cr.working_dir.as_deref(),
                s(w, &["containerRootfs", "workingDir"]),
                "{how}: workingDir"
            );
            let env: Vec<Value> = cr
                .env
                .iter()
                .map(|e| json!({ "name": e.name, "value": e.value }))
                .collect();
            assert_eq!(
                Some(&Value::Array(env)),
                get(w, &["containerRootfs", "env"]),
                "{how}: env"
            );
        }
        let pvc = vol.persistent_volume_claim.as_ref();
        assert_eq!(
            pvc.map(|p| p.claim_name.as_str()),
            s(w, &["persistentVolumeClaim", "claimName"]),
            "{how}: claimName"
        );
        assert_eq!(
            pvc.and_then(|p| p.read_only),
            get(w, &["persistentVolumeClaim", "readOnly"]).and_then(Value::as_bool),
            "{how}: pvc readOnly"
        );
        assert_eq!(
            vol.empty_disk.as_ref().map(|e| e.capacity.0.clone()),
            get(w, &["emptyDisk", "capacity"]).map(qstr),
            "{how}: emptyDisk capacity"
        );
        let ci = vol.cloud_init_no_cloud.as_ref();
        for (field, got) in [
            ("userData", ci.and_then(|c| c.user_data.as_deref())),
            (
                "userDataBase64",
                ci.and_then(|c| c.user_data_base64.as_deref()),
            ),
            ("networkData", ci.and_then(|c| c.network_data.as_deref())),
        ] {
            assert_eq!(
                got,
                s(w, &["cloudInitNoCloud", field]),
                "{how}: cloudInitNoCloud.{field}"
            );
        }
    }
    let nets = get(v, &["spec", "networks"]).and_then(Value::as_array);
    assert_eq!(
        doc.spec.networks.len(),
        nets.map_or(0, Vec::len),
        "{how}: network count"
    );
    assert_eq!(
        doc.spec.termination_grace_period_seconds,
        get(v, &["spec", "terminationGracePeriodSeconds"]).and_then(Value::as_i64),
        "{how}: terminationGracePeriodSeconds"
    );
    assert_eq!(
        doc.guest_memory_bytes,
        num(&["guestMemoryBytes"]),
        "{how}: guestMemoryBytes"
    );
    assert_eq!(doc.vcpus, num(&["vcpus"]), "{how}: vcpus");
}

/// Whether every name that becomes a path is acceptable: `metadata.name` (when given) a DNS
/// subdomain, disk and volume names DNS labels (the launcher refuses the document otherwise).
fn names_are_valid(v: &Value) -> bool {
    use launcher::paths::{is_dns_label, is_dns_subdomain};
    let meta_ok = get(v, &["metadata", "name"])
        .and_then(Value::as_str)
        .is_none_or(is_dns_subdomain);
    let labels_ok = |path: &[&str]| {
        get(v, path)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .all(|e| {
                e.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(is_dns_label)
            })
    };
    meta_ok && labels_ok(&["spec", "domain", "devices", "disks"]) && labels_ok(&["spec", "volumes"])
}

pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    if mode.is_multiple_of(2) {
        let text = String::from_utf8_lossy(inp.rest()).into_owned();
        let parsed = VmiDocument::parse(&text, "fuzz");
        trace!("vmi: raw text parses: {}", parsed.is_ok());
        // The same bytes as an OCI image configuration (an image's config.json is the user's).
        let image = launcher::oci::parse_config(text.as_bytes());
        if let Ok(doc) = parsed {
            derived(&doc);
            if let Ok(image) = &image {
                workload_holds(&doc, image);
            }
        }
        return;
    }
    let v = document(&mut inp);
    let json = serde_json::to_string(&v).expect("JSON");
    let mut yaml = String::new();
    match mode >> 1 & 3 {
        0 | 1 => yaml_block(&v, 0, &mut yaml),
        2 => {
            yaml.push_str("---\n");
            yaml_flow(&v, &mut yaml);
            yaml.push('\n');
        }
        _ if json.chars().all(|c| {
            yaml_printable(c) && !matches!(c, '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}')
        }) =>
        {
            // JSON is YAML too (a comment first, so the YAML parser reads it).
            yaml.push_str("# generated\n");
            yaml.push_str(&json);
        }
        _ => yaml_block(&v, 0, &mut yaml),
    }
    if !names_are_valid(&v) {
        // Names that become paths must be refused by both forms, in one line naming the rule.
        for (text, origin) in [(&json, "vmi.json"), (&yaml, "vmi.yaml")] {
            match VmiDocument::parse(text, origin) {
                Ok(_) => panic!(
                    "{origin}: a name that is not a DNS label/subdomain was accepted\n{text}"
                ),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("must be a DNS"),
                        "{origin}: unexpected error: {msg}"
                    );
                    assert!(
                        !msg.contains('\n'),
                        "{origin}: error is not one line: {msg}"
                    );
                }
            }
        }
        return;
    }
    let from_json = VmiDocument::parse(&json, "vmi.json")
        .unwrap_or_else(|e| panic!("the JSON form does not parse: {e}\n{json}"));
    let from_yaml = VmiDocument::parse(&yaml, "vmi.yaml")
        .unwrap_or_else(|e| panic!("the YAML form does not parse: {e}\n{yaml}"));
    trace!("vmi: JSON and YAML forms parsed:\n{yaml}");
    matches(&from_json, &v, "JSON");
    matches(&from_yaml, &v, "YAML");
    assert_eq!(
        format!("{from_json:?}"),
        format!("{from_yaml:?}"),
        "JSON and YAML forms parse differently"
    );
    derived(&from_json);
}
