//! What the init looks up in the image before it runs the workload: the program in `PATH`, the
//! user and group in `/etc/passwd` and `/etc/group`. The image is the user's: every file is read
//! with a size bound, and a malformed line is skipped, never trusted.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Longest `/etc/passwd` or `/etc/group` read.
const MAX_DB_BYTES: u64 = 4 << 20;

/// Exit status when the program is not found (as shells report it).
pub const NOT_FOUND: u8 = 127;
/// Exit status when the program cannot be run.
pub const NOT_EXECUTABLE: u8 = 126;
/// Exit status when the init itself could not set the workload up (as `docker run` reports a
/// failure before the container's process runs).
pub const INIT_FAILED: u8 = 125;

#[derive(Debug, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

/// Resolves the image's `User` (`uid`, `uid:gid`, `name`, `name:group`; empty: root) against the
/// files under `root`. A numeric uid without a group takes the passwd entry's group when there is
/// one, else gid 0 (as runc).
pub fn user(root: &Path, spec: &str) -> Result<Ids, String> {
    if spec.is_empty() {
        return Ok(Ids { uid: 0, gid: 0 });
    }
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let passwd = read_db(&root.join("etc/passwd"));
    // name:password:uid:gid:...
    let entry = passwd.iter().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        let (uid, gid) = (
            f.get(2)?.parse::<u32>().ok()?,
            f.get(3)?.parse::<u32>().ok()?,
        );
        (f[0] == u || u.parse::<u32>() == Ok(uid)).then_some((uid, gid))
    });
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => entry
            .map(|e| e.0)
            .ok_or_else(|| format!("user {u:?} is not in the image's /etc/passwd"))?,
    };
    let gid = match g {
        None => entry.map(|e| e.1).unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => read_db(&root.join("etc/group"))
                .iter()
                .find_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f[0] == g).then(|| f.get(2)?.parse::<u32>().ok())?
                })
                .ok_or_else(|| format!("group {g:?} is not in the image's /etc/group"))?,
        },
    };
    Ok(Ids { uid, gid })
}

fn read_db(path: &Path) -> Vec<String> {
    let mut text = String::new();
    let _ = std::fs::File::open(path).and_then(|f| f.take(MAX_DB_BYTES).read_to_string(&mut text));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Finds `program` as the workload will see it: with a `/` it is taken as is; else the first
/// executable regular file of that name in `path`'s directories (relative ones skipped). `root`
/// is where the image is mounted (`/` once the init switched to it).
pub fn program(root: &Path, program: &str, path: &str) -> Result<PathBuf, (u8, String)> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    for dir in path.split(':').filter(|d| d.starts_with('/')) {
        let candidate = Path::new(dir).join(program);
        let inside = root.join(candidate.strip_prefix("/").unwrap_or(&candidate));
        // Follows symlinks as exec will (inside the image once the init switched to it).
        if let Ok(m) = std::fs::metadata(&inside) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err((
        NOT_FOUND,
        format!("{program:?}: executable file not found in PATH {path:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Root(PathBuf);
    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn root(name: &str) -> Root {
        let d = std::env::temp_dir().join(format!("mv-init-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::write(
            d.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n# comment\nbroken\napp:x:1000:1001::/home/app:/bin/sh\nodd:x:notanumber:1\n",
        )
        .unwrap();
        std::fs::write(d.join("etc/group"), "root:x:0:\nstaff:x:50:\nbad\n").unwrap();
        Root(d)
    }

    #[test]
    fn users_and_groups_as_runc_resolves_them() {
        let r = root("user");
        let ids = |s| user(&r.0, s);
        assert_eq!(ids(""), Ok(Ids { uid: 0, gid: 0 }));
        assert_eq!(
            ids("app"),
            Ok(Ids {
                uid: 1000,
                gid: 1001
            })
        );
        assert_eq!(
            ids("1000"),
            Ok(Ids {
                uid: 1000,
                gid: 1001
            })
        );
        assert_eq!(ids("4242"), Ok(Ids { uid: 4242, gid: 0 }));
        assert_eq!(ids("app:staff"), Ok(Ids { uid: 1000, gid: 50 }));
        assert_eq!(ids("7:8"), Ok(Ids { uid: 7, gid: 8 }));
        assert!(ids("nobody")
            .unwrap_err()
            .contains("not in the image's /etc/passwd"));
        assert!(ids("app:wheel").unwrap_err().contains("/etc/group"));
        // No passwd file at all: numeric ids still work.
        let empty = std::env::temp_dir().join("mv-init-no-such-root");
        assert_eq!(user(&empty, "5:6"), Ok(Ids { uid: 5, gid: 6 }));
    }

    #[test]
    fn programs_are_looked_up_in_path_inside_the_image() {
        let r = root("path");
        std::fs::create_dir_all(r.0.join("usr/bin")).unwrap();
        std::fs::create_dir_all(r.0.join("bin/python3")).unwrap(); // a directory: skipped
        std::fs::write(r.0.join("usr/bin/python3"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            r.0.join("usr/bin/python3"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(r.0.join("usr/bin/data"), "x").unwrap(); // not executable
        let path = "rel:/bin:/usr/bin";
        assert_eq!(
            program(&r.0, "python3", path),
            Ok(PathBuf::from("/usr/bin/python3"))
        );
        assert_eq!(program(&r.0, "./x", path), Ok(PathBuf::from("./x")));
        assert_eq!(program(&r.0, "data", path).unwrap_err().0, NOT_FOUND);
        assert_eq!(program(&r.0, "nope", path).unwrap_err().0, NOT_FOUND);
    }
}
