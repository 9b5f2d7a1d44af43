//! OCI container images written without a registry, a base image or a container tool: one
//! uncompressed tar layer of the given files, an image config, a manifest and an `index.json`,
//! packed as an OCI image-layout archive that `ctr images import` (and `skopeo copy
//! oci-archive:…`) read.
//!
//! The output is a function of the inputs alone (entries sorted, mtimes 0, owner root), so the
//! manifest digest identifies the content and an unchanged image is never rebuilt: archives are
//! cached by a hash of everything that goes into them.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use ring::digest;

/// Errors building an image.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// Reading an input or writing the archive failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// An entry's path cannot be stored (absolute, `..`, too long, empty).
    #[error("image {image}: bad path {path:?} ({why})")]
    BadPath {
        /// The image name.
        image: String,
        /// The offending path.
        path: String,
        /// Why.
        why: &'static str,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> OciError {
    let context = context.into();
    move |source| OciError::Io { context, source }
}

/// Where an entry's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// A regular file read from this path.
    File(PathBuf),
    /// Bytes given directly.
    Bytes(Vec<u8>),
    /// A directory.
    Dir,
    /// A symbolic link to the given target.
    Symlink(String),
}

/// One entry of the image's file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path inside the image, relative (`usr/bin/x`).
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// The content.
    pub content: Content,
}

impl Entry {
    /// A file copied from `src`, mode 0755 (executables) or 0644.
    pub fn file(path: impl Into<String>, src: impl Into<PathBuf>, executable: bool) -> Self {
        Self {
            path: path.into(),
            mode: if executable { 0o755 } else { 0o644 },
            content: Content::File(src.into()),
        }
    }

    /// A file with the given bytes, mode 0644.
    pub fn bytes(path: impl Into<String>, data: impl Into<Vec<u8>>) -> Self {
        Self {
            path: path.into(),
            mode: 0o644,
            content: Content::Bytes(data.into()),
        }
    }

    /// A directory, mode 0755.
    pub fn dir(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            mode: 0o755,
            content: Content::Dir,
        }
    }

    /// A symbolic link.
    pub fn symlink(path: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            mode: 0o777,
            content: Content::Symlink(target.into()),
        }
    }
}

/// An image to build: a name, one layer, and the runtime configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// Full reference, e.g. `docker.io/microvirt/virt-launcher:dev` (what containerd's image
    /// store and the kubelet see; `microvirt/virt-launcher:dev` in a pod spec means this).
    pub name: String,
    /// The layer's entries (parent directories are added as needed).
    pub entries: Vec<Entry>,
    /// `Entrypoint` of the image config.
    pub entrypoint: Vec<String>,
    /// `Cmd` of the image config.
    pub cmd: Vec<String>,
    /// `Env` of the image config (`KEY=value`).
    pub env: Vec<String>,
    /// Labels of the image config.
    pub labels: Vec<(String, String)>,
}

/// A built image archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// The image name.
    pub name: String,
    /// The OCI archive (a tar of an image layout).
    pub archive: PathBuf,
    /// `sha256:…` of the manifest: what containerd reports as the image's digest.
    pub manifest_digest: String,
    /// Size of the layer in bytes.
    pub layer_size: u64,
}

fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_list(v: &[String]) -> String {
    format!(
        "[{}]",
        v.iter().map(|s| json_str(s)).collect::<Vec<_>>().join(",")
    )
}

/// The tag part of a reference (`dev` of `docker.io/a/b:dev`), `latest` without one.
fn tag_of(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        Some((_, t)) if !t.is_empty() => t,
        _ => "latest",
    }
}

impl Image {
    /// Checks the entries and completes them: sorted, parent directories added, duplicates
    /// refused.
    fn normalized(&self) -> Result<Vec<Entry>, OciError> {
        let bad = |path: &str, why| OciError::BadPath {
            image: self.name.clone(),
            path: path.to_string(),
            why,
        };
        let mut all: Vec<Entry> = Vec::new();
        let mut seen = std::collections::BTreeMap::new();
        for e in &self.entries {
            let p = e.path.trim_end_matches('/');
            if p.is_empty() {
                return Err(bad(&e.path, "empty"));
            }
            if p.starts_with('/') {
                return Err(bad(&e.path, "absolute"));
            }
            if p.split('/').any(|c| c == ".." || c == "." || c.is_empty()) {
                return Err(bad(&e.path, "'.', '..' or '//' component"));
            }
            // Parents first.
            let comps: Vec<&str> = p.split('/').collect();
            for i in 1..comps.len() {
                let parent = comps[..i].join("/");
                seen.entry(parent.clone()).or_insert_with(|| {
                    all.push(Entry::dir(parent));
                    all.len() - 1
                });
            }
            if seen.contains_key(p) {
                let idx = seen[p];
                if all[idx].content == Content::Dir && e.content == Content::Dir {
                    all[idx].mode = e.mode;
                    continue;
                }
                return Err(bad(&e.path, "given twice"));
            }
            seen.insert(p.to_string(), all.len());
            all.push(Entry {
                path: p.to_string(),
                ..e.clone()
            });
        }
        all.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(all)
    }

    /// Hash of every input (entries with file contents, config): the archive's cache key.
    fn input_key(&self, entries: &[Entry]) -> Result<String, OciError> {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(b"microvirt-oci 1\0");
        ctx.update(self.name.as_bytes());
        for e in entries {
            ctx.update(format!("\0{}\0{:o}\0", e.path, e.mode).as_bytes());
            match &e.content {
                Content::File(p) => {
                    ctx.update(b"F");
                    let mut f =
                        File::open(p).map_err(io_err(format!("reading {}", p.display())))?;
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = f
                            .read(&mut buf)
                            .map_err(io_err(format!("reading {}", p.display())))?;
                        if n == 0 {
                            break;
                        }
                        ctx.update(&buf[..n]);
                    }
                }
                Content::Bytes(b) => {
                    ctx.update(b"B");
                    ctx.update(b);
                }
                Content::Dir => ctx.update(b"D"),
                Content::Symlink(t) => {
                    ctx.update(b"L");
                    ctx.update(t.as_bytes());
                }
            }
        }
        for part in [&self.entrypoint, &self.cmd, &self.env] {
            ctx.update(json_list(part).as_bytes());
        }
        for (k, v) in &self.labels {
            ctx.update(format!("\0{k}={v}").as_bytes());
        }
        Ok(hex(ctx.finish().as_ref()))
    }

    /// Writes the image archive into `cache_dir` (reusing it when the inputs are unchanged).
    pub fn build(&self, cache_dir: &Path) -> Result<BuiltImage, OciError> {
        let entries = self.normalized()?;
        let key = self.input_key(&entries)?;
        fs::create_dir_all(cache_dir)
            .map_err(io_err(format!("creating {}", cache_dir.display())))?;
        let stem: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let archive = cache_dir.join(format!("{stem}-{}.tar", &key[..16]));
        let info = archive.with_extension("digest");
        if let (true, Ok(text)) = (archive.is_file(), fs::read_to_string(&info)) {
            let mut it = text.split_whitespace();
            if let (Some(d), Some(s)) = (it.next(), it.next().and_then(|s| s.parse().ok())) {
                return Ok(BuiltImage {
                    name: self.name.clone(),
                    archive,
                    manifest_digest: d.to_string(),
                    layer_size: s,
                });
            }
        }

        // The layer: written to a temp file while hashing (it may be tens of MB).
        let tmp_layer = cache_dir.join(format!(".{stem}-{}.layer.tmp", std::process::id()));
        let (layer_digest, layer_size) = {
            let f = File::create(&tmp_layer)
                .map_err(io_err(format!("creating {}", tmp_layer.display())))?;
            let mut w = HashingWriter::new(BufWriter::new(f));
            write_layer(&mut w, &entries)?;
            let (inner, d, n) = w.finish();
            inner
                .into_inner()
                .map_err(|e| OciError::Io {
                    context: "flushing the layer".into(),
                    source: e.into_error(),
                })?
                .sync_all()
                .map_err(io_err("syncing the layer"))?;
            (d, n)
        };
        let mut config = String::from("{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{");
        let mut fields = Vec::new();
        if !self.env.is_empty() {
            fields.push(format!("\"Env\":{}", json_list(&self.env)));
        }
        if !self.entrypoint.is_empty() {
            fields.push(format!("\"Entrypoint\":{}", json_list(&self.entrypoint)));
        }
        if !self.cmd.is_empty() {
            fields.push(format!("\"Cmd\":{}", json_list(&self.cmd)));
        }
        fields.push("\"WorkingDir\":\"/\"".to_string());
        if !self.labels.is_empty() {
            let l: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{}:{}", json_str(k), json_str(v)))
                .collect();
            fields.push(format!("\"Labels\":{{{}}}", l.join(",")));
        }
        config.push_str(&fields.join(","));
        let _ = write!(
            config,
            "}},\"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[\"sha256:{layer_digest}\"]}},\
             \"history\":[{{\"created_by\":\"microvirt-testsupport oci\"}}]}}"
        );
        let config_digest = sha256_hex(config.as_bytes());
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
             \"config\":{{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\
             \"digest\":\"sha256:{config_digest}\",\"size\":{}}},\
             \"layers\":[{{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\
             \"digest\":\"sha256:{layer_digest}\",\"size\":{layer_size}}}]}}",
            config.len()
        );
        let manifest_digest = sha256_hex(manifest.as_bytes());
        let index = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\
             \"manifests\":[{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
             \"digest\":\"sha256:{manifest_digest}\",\"size\":{},\
             \"platform\":{{\"architecture\":\"amd64\",\"os\":\"linux\"}},\
             \"annotations\":{{\"io.containerd.image.name\":{},\
             \"org.opencontainers.image.ref.name\":{}}}}}]}}",
            manifest.len(),
            json_str(&self.name),
            json_str(tag_of(&self.name)),
        );

        let tmp_archive = cache_dir.join(format!(".{stem}-{}.tar.tmp", std::process::id()));
        {
            let f = File::create(&tmp_archive)
                .map_err(io_err(format!("creating {}", tmp_archive.display())))?;
            let mut w = BufWriter::new(f);
            let mut t = TarWriter { out: &mut w };
            t.dir("blobs", 0o755)?;
            t.dir("blobs/sha256", 0o755)?;
            t.file_bytes(
                &format!("blobs/sha256/{config_digest}"),
                0o644,
                config.as_bytes(),
            )?;
            let mut layer = File::open(&tmp_layer).map_err(io_err("reopening the layer"))?;
            t.file_reader(
                &format!("blobs/sha256/{layer_digest}"),
                0o644,
                layer_size,
                &mut layer,
            )?;
            t.file_bytes(
                &format!("blobs/sha256/{manifest_digest}"),
                0o644,
                manifest.as_bytes(),
            )?;
            t.file_bytes("index.json", 0o644, index.as_bytes())?;
            t.file_bytes("oci-layout", 0o644, b"{\"imageLayoutVersion\":\"1.0.0\"}")?;
            t.finish()?;
            w.flush().map_err(io_err("writing the archive"))?;
        }
        let _ = fs::remove_file(&tmp_layer);
        fs::rename(&tmp_archive, &archive)
            .map_err(io_err(format!("moving {}", archive.display())))?;
        let digest = format!("sha256:{manifest_digest}");
        fs::write(&info, format!("{digest} {layer_size}\n"))
            .map_err(io_err(format!("writing {}", info.display())))?;
        Ok(BuiltImage {
            name: self.name.clone(),
            archive,
            manifest_digest: digest,
            layer_size,
        })
    }
}

fn write_layer(w: &mut impl Write, entries: &[Entry]) -> Result<(), OciError> {
    let mut t = TarWriter { out: w };
    for e in entries {
        match &e.content {
            Content::Dir => t.dir(&e.path, e.mode)?,
            Content::Bytes(b) => t.file_bytes(&e.path, e.mode, b)?,
            Content::Symlink(target) => t.symlink(&e.path, target)?,
            Content::File(src) => {
                let mut f =
                    File::open(src).map_err(io_err(format!("reading {}", src.display())))?;
                let len = f
                    .metadata()
                    .map_err(io_err(format!("reading {}", src.display())))?
                    .len();
                t.file_reader(&e.path, e.mode, len, &mut f)?;
            }
        }
    }
    t.finish()
}

/// A `Write` that hashes (SHA-256) and counts what passes through.
struct HashingWriter<W> {
    inner: W,
    ctx: digest::Context,
    n: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            ctx: digest::Context::new(&digest::SHA256),
            n: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        (self.inner, hex(self.ctx.finish().as_ref()), self.n)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.ctx.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A minimal POSIX ustar writer: regular files, directories, symlinks; owner root, mtime 0.
struct TarWriter<'a, W: Write> {
    out: &'a mut W,
}

impl<W: Write> TarWriter<'_, W> {
    fn header(
        &mut self,
        path: &str,
        mode: u32,
        size: u64,
        kind: u8,
        link: &str,
    ) -> Result<(), OciError> {
        let mut h = [0u8; 512];
        let too_long = || OciError::BadPath {
            image: String::new(),
            path: path.to_string(),
            why: "too long for a tar header",
        };
        // name (100) or prefix (155) + name.
        let (prefix, name) = if path.len() <= 100 {
            ("", path)
        } else {
            let split = path[..path.len().min(156)]
                .rfind('/')
                .filter(|&i| path.len() - i - 1 <= 100)
                .ok_or_else(too_long)?;
            (&path[..split], &path[split + 1..])
        };
        if link.len() > 100 {
            return Err(too_long());
        }
        h[..name.len()].copy_from_slice(name.as_bytes());
        let oct = |h: &mut [u8; 512], off: usize, len: usize, v: u64| {
            let s = format!("{v:0width$o}", width = len - 1);
            h[off..off + len - 1].copy_from_slice(s.as_bytes());
        };
        oct(&mut h, 100, 8, u64::from(mode));
        oct(&mut h, 108, 8, 0);
        oct(&mut h, 116, 8, 0);
        oct(&mut h, 124, 12, size);
        oct(&mut h, 136, 12, 0);
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
        // Checksum: the header's byte sum with the checksum field as spaces.
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        self.out
            .write_all(&h)
            .map_err(io_err("writing a tar header"))
    }

    fn pad(&mut self, size: u64) -> Result<(), OciError> {
        let rem = (size % 512) as usize;
        if rem != 0 {
            self.out
                .write_all(&[0u8; 512][..512 - rem])
                .map_err(io_err("writing tar padding"))?;
        }
        Ok(())
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), OciError> {
        self.header(&format!("{path}/"), mode, 0, b'5', "")
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), OciError> {
        self.header(path, 0o777, 0, b'2', target)
    }

    fn file_bytes(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<(), OciError> {
        self.header(path, mode, data.len() as u64, b'0', "")?;
        self.out
            .write_all(data)
            .map_err(io_err("writing tar data"))?;
        self.pad(data.len() as u64)
    }

    fn file_reader(
        &mut self,
        path: &str,
        mode: u32,
        size: u64,
        r: &mut impl Read,
    ) -> Result<(), OciError> {
        self.header(path, mode, size, b'0', "")?;
        let copied = io::copy(&mut r.take(size), self.out).map_err(io_err("writing tar data"))?;
        if copied != size {
            return Err(OciError::Io {
                context: format!("{path}: file changed while being archived"),
                source: io::ErrorKind::UnexpectedEof.into(),
            });
        }
        self.pad(size)
    }

    fn finish(&mut self) -> Result<(), OciError> {
        self.out
            .write_all(&[0u8; 1024])
            .map_err(io_err("ending the tar stream"))
    }
}

/// The shared libraries a dynamically linked executable loads (its ELF interpreter included),
/// as `ldd` resolves them on this machine: what an image needs beside the binary to run it
/// without a base image.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, OciError> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(io_err(format!("running ldd {}", binary.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // Static binaries: "not a dynamic executable" (exit 1).
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso has no file.
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// Image entries for `binary` at `dest` plus its shared libraries at the same paths as on this
/// machine (symlinked locations such as `/lib64` are stored as the real file at the path the
/// binary asks for).
pub fn binary_with_libraries(binary: &Path, dest: &str) -> Result<Vec<Entry>, OciError> {
    let mut v = vec![Entry::file(dest, binary, true)];
    for lib in shared_libraries(binary)? {
        let real =
            fs::canonicalize(&lib).map_err(io_err(format!("resolving {}", lib.display())))?;
        let p = lib.to_string_lossy().trim_start_matches('/').to_string();
        v.push(Entry::file(p, real, true));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mvts-oci-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// Reads a ustar stream into (path, type, size, data) tuples.
    fn untar(data: &[u8]) -> Vec<(String, u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut off = 0;
        while off + 512 <= data.len() {
            let h = &data[off..off + 512];
            if h.iter().all(|&b| b == 0) {
                break;
            }
            let cstr = |b: &[u8]| {
                String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())])
                    .into_owned()
            };
            let sum: u32 = h[..148]
                .iter()
                .chain(&[b' '; 8])
                .chain(&h[156..])
                .map(|&b| u32::from(b))
                .sum();
            let stored = u32::from_str_radix(cstr(&h[148..155]).trim(), 8).unwrap();
            assert_eq!(sum, stored, "checksum");
            let prefix = cstr(&h[345..500]);
            let name = cstr(&h[..100]);
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let size = u64::from_str_radix(cstr(&h[124..135]).trim(), 8).unwrap() as usize;
            off += 512;
            out.push((path, h[156], data[off..off + size].to_vec()));
            off += size.div_ceil(512) * 512;
        }
        out
    }

    #[test]
    fn archive_is_a_valid_deterministic_oci_layout() {
        let d = tmpdir("a");
        let src = d.join("prog");
        fs::write(&src, b"#!/bin/true\n").unwrap();
        let long = format!("{}/f", "d".repeat(120));
        let img = Image {
            name: "docker.io/microvirt/test:dev".into(),
            entries: vec![
                Entry::file("usr/bin/prog", &src, true),
                Entry::bytes("etc/x", b"hello".to_vec()),
                Entry::symlink("bin", "usr/bin"),
                Entry::bytes(long.clone(), b"deep".to_vec()),
            ],
            entrypoint: vec!["/usr/bin/prog".into()],
            ..Default::default()
        };
        let a = img.build(&d.join("cache")).unwrap();
        assert!(a.manifest_digest.starts_with("sha256:"));
        let files = untar(&fs::read(&a.archive).unwrap());
        let get = |p: &str| files.iter().find(|f| f.0 == p).map(|f| f.2.clone());
        let index: serde_json::Value = serde_json::from_slice(&get("index.json").unwrap()).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], img.name);
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "dev");
        assert_eq!(
            format!("{}", m["digest"].as_str().unwrap()),
            a.manifest_digest
        );
        let manifest = get(&format!("blobs/sha256/{}", &a.manifest_digest[7..])).unwrap();
        assert_eq!(sha256_hex(&manifest), a.manifest_digest[7..]);
        let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let layer = get(&format!("blobs/sha256/{}", &layer_digest[7..])).unwrap();
        assert_eq!(sha256_hex(&layer), layer_digest[7..]);
        let config = get(&format!(
            "blobs/sha256/{}",
            &manifest["config"]["digest"].as_str().unwrap()[7..]
        ))
        .unwrap();
        let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/prog");
        // The layer: parents added, sorted, contents intact, long path split into prefix.
        let entries = untar(&layer);
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "bin",
                &format!("{}/", "d".repeat(120)),
                &long,
                "etc/",
                "etc/x",
                "usr/",
                "usr/bin/",
                "usr/bin/prog"
            ]
        );
        assert_eq!(entries.iter().find(|e| e.0 == "bin").unwrap().1, b'2');
        assert_eq!(entries.iter().find(|e| e.0 == "etc/x").unwrap().2, b"hello");

        // Same inputs: same digest, cached archive reused; a changed input changes it.
        let b = img.build(&d.join("cache2")).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(img.build(&d.join("cache")).unwrap(), a);
        fs::write(&src, b"#!/bin/false\n").unwrap();
        assert_ne!(
            img.build(&d.join("cache")).unwrap().manifest_digest,
            a.manifest_digest
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn bad_paths_are_refused() {
        for p in ["/abs", "a/../b", "", "a//b"] {
            let img = Image {
                name: "x".into(),
                entries: vec![Entry::bytes(p, b"".to_vec())],
                ..Default::default()
            };
            assert!(
                matches!(img.normalized(), Err(OciError::BadPath { .. })),
                "{p}"
            );
        }
        let img = Image {
            name: "x".into(),
            entries: vec![
                Entry::bytes("a", b"1".to_vec()),
                Entry::bytes("a", b"2".to_vec()),
            ],
            ..Default::default()
        };
        assert!(img.normalized().is_err());
    }

    #[test]
    fn libraries_of_a_dynamic_binary() {
        let libs = shared_libraries(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
        assert_eq!(tag_of("docker.io/a/b:dev"), "dev");
        assert_eq!(tag_of("localhost:5000/a/b"), "latest");
    }
}
