//! `extlinux.conf` / `syslinux.cfg`: `DEFAULT <label>`, `LABEL <name>` with `KERNEL` or
//! `LINUX <path>`, `INITRD <path>[,<path>…]`, `APPEND <arguments>` (an `initrd=` argument in
//! `APPEND` names the initrd too, and is dropped from the command line). Keywords are case
//! insensitive. The default is the `DEFAULT` label, else the first label (syslinux then boots a
//! kernel named by `DEFAULT` itself, which is read as such when no label matches). Relative
//! paths are relative to the configuration's directory `dir`.

use super::entry::{self, Entry};

/// Most labels read.
pub const MAX_LABELS: usize = 256;

fn absolute(dir: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{}/{}", dir.trim_end_matches('/'), p)
    }
}

fn initrds(dir: &str, list: &str) -> Vec<String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .take(entry::MAX_INITRDS + 1)
        .map(|p| absolute(dir, p.trim()))
        .collect()
}

/// The entry syslinux boots by default from `text`, a configuration in directory `dir`.
pub fn default_entry(text: &str, dir: &str) -> Result<Entry, String> {
    let mut labels: Vec<Entry> = Vec::new();
    let mut default: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = match line.split_once(|c: char| c.is_ascii_whitespace()) {
            Some((k, v)) => (k.to_ascii_lowercase(), v.trim()),
            None => (line.to_ascii_lowercase(), ""),
        };
        match key.as_str() {
            "default" => default = Some(value.to_string()),
            "label" => {
                if labels.len() == MAX_LABELS {
                    return Err(format!("extlinux: more than {MAX_LABELS} labels"));
                }
                labels.push(Entry {
                    title: value.to_string(),
                    ..Entry::default()
                });
            }
            "kernel" | "linux" => {
                if let Some(l) = labels.last_mut() {
                    l.kernel = absolute(dir, value);
                }
            }
            "initrd" => {
                if let Some(l) = labels.last_mut() {
                    l.initrds = initrds(dir, value);
                }
            }
            "append" => {
                if let Some(l) = labels.last_mut() {
                    let mut words = Vec::new();
                    for w in value.split_ascii_whitespace() {
                        match w.strip_prefix("initrd=") {
                            Some(list) => l.initrds = initrds(dir, list),
                            None => words.push(w.to_string()),
                        }
                    }
                    l.options = entry::join(&words);
                }
            }
            _ => {}
        }
    }
    let chosen = match &default {
        Some(d) => match labels.iter().find(|l| &l.title == d) {
            Some(l) => l.clone(),
            None => {
                // `DEFAULT vmlinuz args…`: a kernel and its command line.
                let mut words = d.split_ascii_whitespace();
                let k = words.next().unwrap_or_default();
                Entry {
                    title: d.clone(),
                    kernel: absolute(dir, k),
                    options: words.collect::<Vec<_>>().join(" "),
                    ..Entry::default()
                }
            }
        },
        None => labels
            .first()
            .cloned()
            .ok_or_else(|| "extlinux: no LABEL and no DEFAULT".to_string())?,
    };
    if chosen.kernel.is_empty() {
        return Err(format!(
            "extlinux: label {:?} has no KERNEL or LINUX line",
            entry::clip(&chosen.title)
        ));
    }
    chosen.check()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_label() {
        let cfg = "# generated\nDEFAULT linux\nTIMEOUT 10\nLABEL rescue\n  LINUX /boot/vmlinuz-rescue\nLABEL linux\n  KERNEL vmlinuz-6.1\n  INITRD initrd.img-6.1,extra.img\n  APPEND root=UUID=1234 ro console=ttyS0\n";
        let e = default_entry(cfg, "/boot/extlinux").unwrap();
        assert_eq!(e.kernel, "/boot/extlinux/vmlinuz-6.1");
        assert_eq!(
            e.initrds,
            ["/boot/extlinux/initrd.img-6.1", "/boot/extlinux/extra.img"]
        );
        assert_eq!(e.options, "root=UUID=1234 ro console=ttyS0");
    }

    #[test]
    fn first_label_and_initrd_in_append() {
        let cfg = "label a\nkernel /vmlinuz\nappend initrd=/initrd.gz root=/dev/vda1 rw\nlabel b\nkernel /b\n";
        let e = default_entry(cfg, "/").unwrap();
        assert_eq!(e.kernel, "/vmlinuz");
        assert_eq!(e.initrds, ["/initrd.gz"]);
        assert_eq!(e.options, "root=/dev/vda1 rw");
    }

    #[test]
    fn default_as_a_kernel_and_refusals() {
        let e = default_entry("DEFAULT /vmlinuz root=/dev/vda2\n", "/").unwrap();
        assert_eq!(e.kernel, "/vmlinuz");
        assert_eq!(e.options, "root=/dev/vda2");
        assert!(default_entry("TIMEOUT 1\n", "/")
            .unwrap_err()
            .contains("no LABEL"));
        assert!(default_entry("LABEL x\nAPPEND ro\n", "/")
            .unwrap_err()
            .contains("no KERNEL"));
        let many = "LABEL x\nKERNEL /k\n".repeat(MAX_LABELS + 1);
        assert!(default_entry(&many, "/").unwrap_err().contains("more than"));
    }
}
