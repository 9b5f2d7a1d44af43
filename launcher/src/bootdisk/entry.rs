//! What a boot configuration boots: the entry every parser (BLS, GRUB, extlinux) returns.

/// Longest command line taken from a boot configuration (Linux's x86 limit is 2048 bytes
/// with the VMM's own arguments; the VMM checks the final line).
pub const OPTIONS_MAX: usize = 4096;
/// Most initrds one entry may name.
pub const MAX_INITRDS: usize = 16;
/// Longest path accepted.
pub const PATH_MAX: usize = 1024;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// For messages: the entry's title or label.
    pub title: String,
    /// The kernel's path as the configuration writes it (absolute on its file system).
    pub kernel: String,
    pub initrds: Vec<String>,
    /// The kernel command line (the distribution's `root=` included).
    pub options: String,
    /// GRUB: the file system UUID that `search --fs-uuid --set=root` selects in the entry.
    pub root_uuid: Option<String>,
}

impl Entry {
    /// Checks the bounds every parser promises.
    pub fn check(self) -> Result<Self, String> {
        if self.kernel.is_empty() {
            return Err(format!("entry {:?} names no kernel", self.title));
        }
        for p in std::iter::once(&self.kernel).chain(&self.initrds) {
            if p.len() > PATH_MAX || !p.starts_with('/') {
                return Err(format!(
                    "entry {:?}: path {:?} is not an absolute path of at most {PATH_MAX} bytes",
                    self.title,
                    clip(p)
                ));
            }
        }
        if self.initrds.len() > MAX_INITRDS {
            return Err(format!(
                "entry {:?}: more than {MAX_INITRDS} initrds",
                self.title
            ));
        }
        if self.options.len() > OPTIONS_MAX {
            return Err(format!(
                "entry {:?}: command line longer than {OPTIONS_MAX} bytes",
                self.title
            ));
        }
        if self.options.chars().any(|c| c.is_control()) {
            return Err(format!(
                "entry {:?}: control characters in the command line",
                self.title
            ));
        }
        Ok(self)
    }
}

/// At most 64 bytes of `s` (for messages), cut at a character boundary.
pub fn clip(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Cuts `s` to at most `max` bytes, at a character boundary (`String::truncate` panics
/// inside a character).
pub fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Words joined by single spaces.
pub fn join(words: &[String]) -> String {
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_bounds() {
        let ok = Entry {
            title: "t".into(),
            kernel: "/vmlinuz".into(),
            initrds: vec!["/initrd".into()],
            options: "root=UUID=x ro".into(),
            root_uuid: None,
        };
        assert!(ok.clone().check().is_ok());
        let mut e = ok.clone();
        e.kernel = "vmlinuz".into();
        assert!(e.check().unwrap_err().contains("absolute"));
        let mut e = ok.clone();
        e.kernel.clear();
        assert!(e.check().unwrap_err().contains("no kernel"));
        let mut e = ok.clone();
        e.options = "a\nb".into();
        assert!(e.check().unwrap_err().contains("control"));
        let mut e = ok;
        e.options = "x".repeat(OPTIONS_MAX + 1);
        assert!(e.check().unwrap_err().contains("longer"));
        assert_eq!(clip("äöü"), "äöü");
        // Found by the bootcfg fuzz target: a cut inside a character.
        let mut t = "aé".to_string();
        truncate(&mut t, 2);
        assert_eq!(t, "a");
        truncate(&mut t, 5);
        assert_eq!(t, "a");
        assert_eq!(clip(&"é".repeat(40)).len(), 64);
    }
}
