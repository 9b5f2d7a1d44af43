//! Links the two guest binaries with their own linker scripts: both load at 1 MiB, only
//! `testguest-pvh` keeps the `.note.pvh` section (and so gets a PT_NOTE with the PVH entry).

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let template_path = manifest.join("link.ld.in");
    println!("cargo:rerun-if-changed={}", template_path.display());
    println!("cargo:rerun-if-changed=build.rs");
    let template = std::fs::read_to_string(&template_path).expect("read link.ld.in");
    for (bin, note) in [
        (
            "testguest-pvh",
            "  .note.pvh : ALIGN(4) { KEEP(*(.note.pvh)) } :text :note",
        ),
        ("testguest-linux64", "  /DISCARD/ : { *(.note.pvh) }"),
    ] {
        let phdrs = if note.contains(":note") {
            "  note PT_NOTE FLAGS(4);"
        } else {
            ""
        };
        let script = template
            .replace("@NOTE_PHDR@", phdrs)
            .replace("@NOTE_SECTION@", note);
        let path = out.join(format!("{bin}.ld"));
        std::fs::write(&path, script).expect("write linker script");
        println!("cargo:rustc-link-arg-bin={bin}=-T{}", path.display());
    }
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wl,--build-id=none",
        "-Wl,-z,max-page-size=4096",
        "-Wl,-z,noexecstack",
        "-Wl,--no-eh-frame-hdr",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}
