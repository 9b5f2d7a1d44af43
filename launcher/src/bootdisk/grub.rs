//! GRUB 2's `grub.cfg`, as far as a generated one (Debian's and Ubuntu's `grub-mkconfig`)
//! needs: `set name=value` (evaluated in order; `if` conditions are not evaluated, so the last
//! `set default=` with a non-empty value wins), `menuentry` and `submenu` blocks, and inside the
//! default entry `linux`/`linux16`/`linuxefi`, `initrd`/`initrd16`/`initrdefi` and
//! `search … --set=root <fs uuid>`. `$name` and `${name}` are replaced by the variables set so
//! far and the GRUB environment block (`grubenv`); an unset variable is empty, as in GRUB.
//! `default` is an entry number (`1>2` inside a submenu), an entry title or an entry id
//! (`--id`, `$menuentry_id_option`); one that names no entry means entry 0, as in GRUB.
//!
//! Bounded: at most [`MAX_ENTRIES`] entries, [`MAX_VARS`] variables of at most
//! [`MAX_VALUE`] bytes each, blocks nested at most [`MAX_DEPTH`] deep.

use std::collections::BTreeMap;

use super::entry::{self, Entry};

pub const MAX_ENTRIES: usize = 256;
pub const MAX_VARS: usize = 256;
pub const MAX_VALUE: usize = 4096;
pub const MAX_DEPTH: usize = 16;
/// Most bytes variable expansion adds to one line.
pub const MAX_LINE_EXPANSION: usize = 1 << 16;

/// A `menuentry` or a `submenu`, with what its body says.
#[derive(Debug, Default)]
struct Item {
    title: String,
    id: Option<String>,
    /// Submenus: their entries.
    children: Vec<Item>,
    submenu: bool,
    entry: Entry,
}

/// Splits a line into statements of words: whitespace separates words, `'…'` and `"…"` quote,
/// `\` escapes, an unquoted `;` ends a statement, an unquoted `#` at the start of a word starts
/// a comment. Variables are expanded outside single quotes.
fn statements(line: &str, vars: &BTreeMap<String, String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    // Bytes that expansions added to this line: capped, so `$a$a$a…` cannot blow up.
    let mut expanded = 0usize;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), c) => word.push(c),
            (Some('"'), '"') => quote = None,
            (q, '$') => {
                let name: String = if chars.peek() == Some(&'{') {
                    chars.next();
                    let n: String = chars.by_ref().take_while(|c| *c != '}').collect();
                    n
                } else {
                    let mut n = String::new();
                    while let Some(c) = chars.peek() {
                        if c.is_ascii_alphanumeric() || *c == '_' {
                            n.push(*c);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    n
                };
                if name.is_empty() {
                    word.push('$');
                } else if let Some(v) = vars.get(&name).filter(|_| expanded <= MAX_LINE_EXPANSION) {
                    expanded += v.len();
                    if q.is_none() {
                        // Unquoted expansion splits into words, as in GRUB.
                        let mut parts = v.split_ascii_whitespace().peekable();
                        while let Some(p) = parts.next() {
                            word.push_str(p);
                            if parts.peek().is_some() {
                                words.push(std::mem::take(&mut word));
                            }
                        }
                    } else {
                        word.push_str(v);
                    }
                }
                // An unset or empty variable outside quotes makes no word.
                in_word = in_word || !word.is_empty() || q.is_some();
            }
            (Some(_), '\\') | (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                }
                in_word = true;
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            (None, ';') => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                if !words.is_empty() {
                    out.push(std::mem::take(&mut words));
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
        if word.len() > MAX_VALUE {
            entry::truncate(&mut word, MAX_VALUE);
        }
    }
    if in_word {
        words.push(word);
    }
    if !words.is_empty() {
        out.push(words);
    }
    out
}

/// Drops the shell keywords that lead a statement (`if`/`elif` conditions are dropped whole).
fn strip_keywords(mut s: Vec<String>) -> Option<Vec<String>> {
    loop {
        match s.first().map(String::as_str) {
            Some("if" | "elif" | "while" | "until") => return None,
            Some("then" | "else" | "do") => {
                s.remove(0);
            }
            Some("fi" | "done") => return None,
            Some(_) => return Some(s),
            None => return None,
        }
    }
}

fn set_var(vars: &mut BTreeMap<String, String>, assignment: &str) {
    if let Some((k, v)) = assignment.split_once('=') {
        if vars.len() < MAX_VARS || vars.contains_key(k) {
            let mut v = v.to_string();
            entry::truncate(&mut v, MAX_VALUE);
            vars.insert(k.to_string(), v);
        }
    }
}

/// A `menuentry`/`submenu` header's title and id (`--id X`, also what
/// `$menuentry_id_option X` expands to).
fn header(words: &[String]) -> (String, Option<String>) {
    let title = words.get(1).cloned().unwrap_or_default();
    let id = words
        .iter()
        .position(|w| w == "--id")
        .and_then(|i| words.get(i + 1))
        .filter(|w| w.as_str() != "{")
        .cloned();
    (title, id)
}

/// Strips a GRUB device prefix (`($root)`, `(hd0,gpt2)`) from a path.
fn strip_device(p: &str) -> String {
    if p.starts_with('(') {
        if let Some(i) = p.find(')') {
            return p[i + 1..].to_string();
        }
    }
    p.to_string()
}

/// Applies one statement inside an entry.
fn entry_statement(e: &mut Entry, s: &[String], vars: &mut BTreeMap<String, String>) {
    match s[0].as_str() {
        "linux" | "linux16" | "linuxefi" => {
            if let Some(k) = s.get(1) {
                e.kernel = strip_device(k);
                e.options = entry::join(&s[2..]);
            }
        }
        "initrd" | "initrd16" | "initrdefi" => {
            e.initrds = s[1..]
                .iter()
                .take(entry::MAX_INITRDS + 1)
                .map(|p| strip_device(p))
                .collect();
        }
        "search" | "search.fs_uuid" => {
            let set_root = s
                .iter()
                .any(|w| w == "--set=root" || w == "--set" || w == "-s");
            let by_uuid =
                s[0] == "search.fs_uuid" || s.iter().any(|w| w == "--fs-uuid" || w == "-u");
            if set_root && by_uuid {
                if let Some(u) = s
                    .iter()
                    .skip(1)
                    .rfind(|w| !w.starts_with('-') && *w != "root")
                {
                    e.root_uuid = Some(u.to_ascii_lowercase());
                }
            }
        }
        "set" => {
            if let Some(a) = s.get(1) {
                set_var(vars, a);
            }
        }
        _ => {}
    }
}

/// Parses `text` into its top-level items and the final value of `default`.
fn parse(text: &str, env: &BTreeMap<String, String>) -> Result<(Vec<Item>, String), String> {
    let mut vars = env.clone();
    vars.retain(|k, _| k.len() <= 64);
    while vars.len() > MAX_VARS {
        vars.pop_last();
    }
    vars.insert("menuentry_id_option".into(), "--id".into());
    // Open blocks: (item, is it an entry/submenu we keep).
    let mut stack: Vec<Option<Item>> = Vec::new();
    let mut top: Vec<Item> = Vec::new();
    let mut count = 0usize;
    for line in text.lines() {
        for s in statements(line, &vars) {
            let Some(s) = strip_keywords(s) else { continue };
            let opens = s.last().is_some_and(|w| w == "{");
            if s[0] == "}" {
                let Some(closed) = stack.pop() else {
                    return Err("grub.cfg: `}` without an open block".into());
                };
                if let Some(item) = closed {
                    match stack.last_mut() {
                        None => top.push(item),
                        Some(Some(p)) if p.submenu => p.children.push(item),
                        // Inside an entry or a function: not a menu entry.
                        Some(_) => {}
                    }
                }
                continue;
            }
            if opens {
                if stack.len() >= MAX_DEPTH {
                    return Err(format!(
                        "grub.cfg: blocks nested more than {MAX_DEPTH} deep"
                    ));
                }
                let kind = s[0].as_str();
                let item = if matches!(kind, "menuentry" | "submenu") {
                    count += 1;
                    if count > MAX_ENTRIES {
                        return Err(format!("grub.cfg: more than {MAX_ENTRIES} entries"));
                    }
                    let (title, id) = header(&s);
                    Some(Item {
                        entry: Entry {
                            title: title.clone(),
                            ..Entry::default()
                        },
                        title,
                        id,
                        submenu: kind == "submenu",
                        children: Vec::new(),
                    })
                } else {
                    None
                };
                stack.push(item);
                continue;
            }
            match stack.last_mut() {
                Some(Some(item)) if !item.submenu => {
                    entry_statement(&mut item.entry, &s, &mut vars)
                }
                Some(_) => {}
                None => {
                    if s[0] == "set" {
                        if let Some(a) = s.get(1) {
                            set_var(&mut vars, a);
                        }
                    }
                }
            }
        }
    }
    if !stack.is_empty() {
        return Err("grub.cfg: a block is not closed".into());
    }
    let default = vars.get("default").cloned().unwrap_or_default();
    Ok((top, default))
}

/// Finds the item `sel` (a number, a title or an id) among `items`.
fn find<'a>(items: &'a [Item], sel: &str) -> Option<&'a Item> {
    if let Ok(n) = sel.trim().parse::<usize>() {
        return items.get(n);
    }
    items
        .iter()
        .find(|i| i.title == sel || i.id.as_deref() == Some(sel))
}

/// The entry GRUB boots by default from `text`; `env` is the GRUB environment block.
pub fn default_entry(text: &str, env: &BTreeMap<String, String>) -> Result<Entry, String> {
    let (items, default) = parse(text, env)?;
    if items.is_empty() {
        return Err("grub.cfg has no menuentry".into());
    }
    let mut level: &[Item] = &items;
    let mut chosen: Option<&Item> = None;
    for part in default.split('>') {
        match find(level, part) {
            Some(i) => {
                chosen = Some(i);
                level = &i.children;
            }
            None => {
                chosen = None;
                break;
            }
        }
    }
    let mut item = chosen.unwrap_or(&items[0]);
    // A submenu chosen as a whole: its first entry.
    for _ in 0..MAX_DEPTH {
        if !item.submenu {
            break;
        }
        match item.children.first() {
            Some(c) => item = c,
            None => return Err(format!("grub.cfg: submenu {:?} is empty", item.title)),
        }
    }
    if item.submenu {
        return Err("grub.cfg: submenus nested too deep".into());
    }
    if item.entry.kernel.is_empty() {
        return Err(format!(
            "grub.cfg: the default entry {:?} has no `linux` line",
            entry::clip(&item.title)
        ));
    }
    item.entry.clone().check()
}

/// Parses a GRUB environment block (`grubenv`: `name=value` lines, `#` padding).
pub fn parse_env(text: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            if env.len() < MAX_VARS && k.len() <= 64 {
                let mut v = v.to_string();
                entry::truncate(&mut v, MAX_VALUE);
                env.insert(k.to_string(), v);
            }
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like Debian 12's generated grub.cfg (abridged).
    const DEBIAN: &str = r#"
if [ -s $prefix/grubenv ]; then
  set have_grubenv=true
  load_env
fi
if [ "${next_entry}" ] ; then
   set default="${next_entry}"
   set next_entry=
   save_env next_entry
   set boot_once=true
else
   set default="0"
fi
function load_video {
  insmod all_video
}
menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-0b9e' {
	load_video
	insmod gzio
	if [ x$grub_platform = xxen ]; then insmod xzio; insmod lzopio; fi
	insmod part_gpt
	insmod ext2
	search --no-floppy --fs-uuid --set=root 0B9E-ABCD
	echo	'Loading Linux 6.1.0-13-cloud-amd64 ...'
	linux	/boot/vmlinuz-6.1.0-13-cloud-amd64 root=PARTUUID=6a8c ro  console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200 consoleblank=0
	echo	'Loading initial ramdisk ...'
	initrd	/boot/initrd.img-6.1.0-13-cloud-amd64
}
submenu 'Advanced options for Debian GNU/Linux' $menuentry_id_option 'gnulinux-advanced-0b9e' {
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-13-cloud-amd64' --class debian $menuentry_id_option 'gnulinux-6.1.0-13-cloud-amd64-advanced-0b9e' {
		linux	/boot/vmlinuz-6.1.0-13-cloud-amd64 root=PARTUUID=6a8c ro  console=tty0
		initrd	/boot/initrd.img-6.1.0-13-cloud-amd64
	}
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-13-cloud-amd64 (recovery mode)' --class debian $menuentry_id_option 'gnulinux-6.1.0-13-cloud-amd64-recovery-0b9e' {
		linux	/boot/vmlinuz-6.1.0-13-cloud-amd64 root=PARTUUID=6a8c ro single
		initrd	/boot/initrd.img-6.1.0-13-cloud-amd64
	}
}
"#;

    #[test]
    fn debian_default_entry() {
        let e = default_entry(DEBIAN, &BTreeMap::new()).unwrap();
        assert_eq!(e.kernel, "/boot/vmlinuz-6.1.0-13-cloud-amd64");
        assert_eq!(e.initrds, ["/boot/initrd.img-6.1.0-13-cloud-amd64"]);
        assert_eq!(
            e.options,
            "root=PARTUUID=6a8c ro console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200 consoleblank=0"
        );
        assert_eq!(e.root_uuid.as_deref(), Some("0b9e-abcd"));
        assert_eq!(e.title, "Debian GNU/Linux");
    }

    #[test]
    fn default_by_number_path_title_and_id() {
        let with = |d: &str| DEBIAN.replace("set default=\"0\"", &format!("set default=\"{d}\""));
        let e = default_entry(&with("1>1"), &BTreeMap::new()).unwrap();
        assert!(e.options.ends_with("single"), "{e:?}");
        let e = default_entry(
            &with("gnulinux-advanced-0b9e>gnulinux-6.1.0-13-cloud-amd64-recovery-0b9e"),
            &BTreeMap::new(),
        )
        .unwrap();
        assert!(e.options.ends_with("single"));
        let e = default_entry(&with("1"), &BTreeMap::new()).unwrap();
        assert_eq!(e.options, "root=PARTUUID=6a8c ro console=tty0");
        let e = default_entry(&with("Debian GNU/Linux"), &BTreeMap::new()).unwrap();
        assert_eq!(e.title, "Debian GNU/Linux");
        // A default that names nothing: entry 0.
        let e = default_entry(&with("7"), &BTreeMap::new()).unwrap();
        assert_eq!(e.title, "Debian GNU/Linux");
    }

    #[test]
    fn variables_and_devices() {
        let cfg = "set k=/vmlinuz\nset extra=\"quiet splash\"\nmenuentry 'U' {\n linux ($root)${k} root=LABEL=cloudimg-rootfs ro $extra $vt_handoff\n initrd (hd0,gpt1)/initrd.img /extra.img\n}\n";
        let e = default_entry(cfg, &BTreeMap::new()).unwrap();
        assert_eq!(e.kernel, "/vmlinuz");
        assert_eq!(e.options, "root=LABEL=cloudimg-rootfs ro quiet splash");
        assert_eq!(e.initrds, ["/initrd.img", "/extra.img"]);
        // grubenv's saved_entry picks the entry.
        let cfg = "set default=\"${saved_entry}\"\nmenuentry 'a' {\nlinux /a\n}\nmenuentry 'b' {\nlinux /b\n}\n";
        let env = parse_env("# GRUB Environment Block\nsaved_entry=b\n#######\n");
        assert_eq!(default_entry(cfg, &env).unwrap().kernel, "/b");
    }

    #[test]
    fn broken_configs_are_refused() {
        assert!(default_entry("set default=0\n", &BTreeMap::new())
            .unwrap_err()
            .contains("no menuentry"));
        assert!(
            default_entry("menuentry 'a' {\nlinux /a\n", &BTreeMap::new())
                .unwrap_err()
                .contains("not closed")
        );
        assert!(default_entry("}\n", &BTreeMap::new())
            .unwrap_err()
            .contains("without an open block"));
        assert!(
            default_entry("menuentry 'a' {\necho hi\n}\n", &BTreeMap::new())
                .unwrap_err()
                .contains("no `linux` line")
        );
        let deep = "if x; then\n".to_string() + &"menuentry a {\n".repeat(MAX_DEPTH + 1);
        assert!(default_entry(&deep, &BTreeMap::new())
            .unwrap_err()
            .contains("nested"));
        let many = "menuentry a {\nlinux /a\n}\n".repeat(MAX_ENTRIES + 1);
        assert!(default_entry(&many, &BTreeMap::new())
            .unwrap_err()
            .contains("more than"));
    }

    #[test]
    fn values_are_cut_at_character_boundaries() {
        // Found by the bootcfg fuzz target: a value cut inside a character panicked.
        let long = format!("a{}", "é".repeat(MAX_VALUE));
        let env = parse_env(&format!("x={long}\n"));
        assert!(env["x"].len() <= MAX_VALUE);
        let cfg = format!("set y={long}\nmenuentry 'a' {{\nlinux /a{long}\n}}\n");
        assert!(default_entry(&cfg, &env).is_err());
    }

    #[test]
    fn expansion_is_bounded() {
        let mut cfg = String::from("set a=xxxxxxxxxxxxxxxx\n");
        for _ in 0..40 {
            cfg.push_str("set a=$a$a\n");
        }
        cfg.push_str("menuentry 'a' {\nlinux /a $a $a\n}\n");
        let e = default_entry(&cfg, &BTreeMap::new());
        // The value is capped, so the line is refused for its length, not built in full.
        assert!(e.unwrap_err().contains("longer than"));
    }
}
