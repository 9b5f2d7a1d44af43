//! Boot Loader Specification type #1 entries (`/loader/entries/*.conf`): `title`, `version`,
//! `linux`, `initrd` (repeatable), `options` (repeatable, joined), `sort-key`. The entry booted
//! is the first after sorting as the specification says: by `sort-key`, then by `version`
//! newest first, then by file name newest first. `$name` in `options` is replaced from the
//! GRUB environment block (Fedora's older `$kernelopts`).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::entry::Entry;

/// One parsed entry file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlsEntry {
    pub file: String,
    pub sort_key: Option<String>,
    pub version: Option<String>,
    pub entry: Entry,
}

/// Parses one entry file. `env`: variables for `$name` in `options`.
pub fn parse(file: &str, text: &str, env: &BTreeMap<String, String>) -> Result<BlsEntry, String> {
    let mut e = Entry {
        title: file.to_string(),
        ..Entry::default()
    };
    let (mut sort_key, mut version, mut options) = (None, None, Vec::new());
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = match line.split_once(|c: char| c.is_ascii_whitespace()) {
            Some((k, v)) => (k, v.trim()),
            None => (line, ""),
        };
        match key {
            "title" => e.title = value.to_string(),
            "version" => version = Some(value.to_string()),
            "sort-key" => sort_key = Some(value.to_string()),
            "linux" => e.kernel = value.to_string(),
            "initrd" => {
                for i in value.split_ascii_whitespace() {
                    if e.initrds.len() > super::entry::MAX_INITRDS {
                        break;
                    }
                    e.initrds.push(i.to_string());
                }
            }
            "options" => {
                for w in value.split_ascii_whitespace() {
                    match w.strip_prefix('$') {
                        Some(var) => {
                            if let Some(v) = env.get(var.trim_matches(['{', '}'])) {
                                options.push(v.clone());
                            }
                        }
                        None => options.push(w.to_string()),
                    }
                    if options.iter().map(|o| o.len() + 1).sum::<usize>()
                        > super::entry::OPTIONS_MAX
                    {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    e.options = options.join(" ");
    if e.kernel.is_empty() {
        return Err(format!("BLS entry {file}: no `linux` line"));
    }
    Ok(BlsEntry {
        file: file.to_string(),
        sort_key,
        version,
        entry: e.check()?,
    })
}

/// Compares version strings the way `rpmvercmp`-like sorts do, enough for kernel versions:
/// runs of digits numerically, other runs byte-wise.
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let (ra, rb);
                let o = if x.is_ascii_digit() && y.is_ascii_digit() {
                    let na = a.iter().take_while(|c| c.is_ascii_digit()).count();
                    let nb = b.iter().take_while(|c| c.is_ascii_digit()).count();
                    (ra, rb) = (&a[..na], &b[..nb]);
                    let (ta, tb) = (trim_zeros(ra), trim_zeros(rb));
                    ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb))
                } else {
                    let na = a.iter().take_while(|c| !c.is_ascii_digit()).count().max(1);
                    let nb = b.iter().take_while(|c| !c.is_ascii_digit()).count().max(1);
                    (ra, rb) = (&a[..na], &b[..nb]);
                    ra.cmp(rb)
                };
                if o != Ordering::Equal {
                    return o;
                }
                a = &a[ra.len()..];
                b = &b[rb.len()..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|c| **c == b'0').count();
    &d[n..]
}

/// The entry a BLS boot loader boots by default among `entries`.
pub fn pick(mut entries: Vec<BlsEntry>) -> Option<BlsEntry> {
    entries.sort_by(|x, y| {
        let key = match (&x.sort_key, &y.sort_key) {
            (Some(a), Some(b)) => a.cmp(b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        key.then_with(|| {
            version_cmp(
                y.version.as_deref().unwrap_or(""),
                x.version.as_deref().unwrap_or(""),
            )
        })
        .then_with(|| version_cmp(&y.file, &x.file))
    });
    entries.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FEDORA: &str = "title Fedora Linux (6.8.5-301.fc40.x86_64) 40 (Cloud Edition)
version 6.8.5-301.fc40.x86_64
linux /vmlinuz-6.8.5-301.fc40.x86_64
initrd /initramfs-6.8.5-301.fc40.x86_64.img
options root=UUID=a1b2 ro rootflags=subvol=root $extra
grub_users $grub_users
grub_arg --unrestricted
grub_class fedora
";

    #[test]
    fn parses_a_fedora_entry() {
        let mut env = BTreeMap::new();
        env.insert("extra".to_string(), "console=ttyS0".to_string());
        let e = parse("a.conf", FEDORA, &env).unwrap();
        assert_eq!(e.entry.kernel, "/vmlinuz-6.8.5-301.fc40.x86_64");
        assert_eq!(e.entry.initrds, ["/initramfs-6.8.5-301.fc40.x86_64.img"]);
        assert_eq!(
            e.entry.options,
            "root=UUID=a1b2 ro rootflags=subvol=root console=ttyS0"
        );
        assert!(e.entry.title.starts_with("Fedora Linux"));
        let e = parse("a.conf", FEDORA, &BTreeMap::new()).unwrap();
        assert_eq!(e.entry.options, "root=UUID=a1b2 ro rootflags=subvol=root");
    }

    #[test]
    fn refuses_entries_without_kernel_or_with_relative_paths() {
        assert!(parse("x.conf", "title x\n", &BTreeMap::new())
            .unwrap_err()
            .contains("no `linux`"));
        assert!(parse("x.conf", "linux vmlinuz\n", &BTreeMap::new())
            .unwrap_err()
            .contains("absolute"));
    }

    #[test]
    fn newest_version_wins() {
        assert_eq!(version_cmp("6.10.1", "6.9.12"), Ordering::Greater);
        assert_eq!(version_cmp("6.1.0-13", "6.1.0-9"), Ordering::Greater);
        assert_eq!(version_cmp("1.010", "1.10"), Ordering::Equal);
        let e = |f: &str, v: &str| BlsEntry {
            file: f.into(),
            sort_key: None,
            version: Some(v.into()),
            entry: Entry::default(),
        };
        let p = pick(vec![
            e("a.conf", "6.9.12"),
            e("b.conf", "6.10.1"),
            e("c.conf", "6.2"),
        ]);
        assert_eq!(p.unwrap().file, "b.conf");
        let mut keyed = e("z.conf", "1");
        keyed.sort_key = Some("fedora".into());
        let p = pick(vec![e("b.conf", "6.10.1"), keyed]);
        assert_eq!(p.unwrap().file, "z.conf");
        assert!(pick(Vec::new()).is_none());
    }
}
