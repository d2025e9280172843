//! Tells the linker where libfreetoken is, with no crates (the crate builds offline):
//! - `FREETOKEN_LIB_DIR=DIR`: links `DIR/libfreetoken.so` as it is (no version check);
//! - else the `pkg-config` program (or `$PKG_CONFIG`) must find `freetoken` at least at the
//!   version these declarations describe, through the usual `PKG_CONFIG_PATH`.
//!
//! The folder is published to the build scripts of dependents as `DEP_FREETOKEN_LIBDIR` (and the
//! headers' folder, when pkg-config knows it, as `DEP_FREETOKEN_INCLUDE`). Binaries that should
//! find the library at run time without the loader's help add their own run path from it: a
//! library crate's link arguments reach only its own test binaries, so the run path this script
//! adds serves this crate's tests alone.
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The oldest library these declarations describe (the header version they follow).
const MIN_VERSION: &str = "0.8.0";

fn main() {
    for var in ["FREETOKEN_LIB_DIR", "PKG_CONFIG", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let libdir = match env::var_os("FREETOKEN_LIB_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !dir.join("libfreetoken.so").exists() && !dir.join("libfreetoken.dylib").exists() {
                fail(&format!("FREETOKEN_LIB_DIR={} holds no libfreetoken.so", dir.display()));
            }
            println!("cargo:rustc-link-lib=dylib=freetoken");
            dir
        }
        None => from_pkg_config(),
    };
    let libdir = libdir.canonicalize().unwrap_or(libdir);
    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:libdir={}", libdir.display());
    // This crate's own tests load the library without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", libdir.display());
}

fn fail(msg: &str) -> ! {
    eprintln!("freetoken-sys: {msg}");
    std::process::exit(1)
}

/// Runs pkg-config with `args`; Ok(stdout) on success, Err(stderr or the spawn error).
fn pkg_config(tool: &str, args: &[&str]) -> Result<String, String> {
    match Command::new(tool).args(args).output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => Err(format!("cannot run {tool}: {e}")),
    }
}

fn from_pkg_config() -> PathBuf {
    let tool = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let found = pkg_config(&tool, &["--modversion", "freetoken"]).unwrap_or_else(|e| {
        fail(&format!(
            "{tool} cannot find freetoken ({e}); put PREFIX/lib/pkgconfig on PKG_CONFIG_PATH or set \
             FREETOKEN_LIB_DIR to the folder of libfreetoken.so"
        ))
    });
    let atleast = format!("--atleast-version={MIN_VERSION}");
    if pkg_config(&tool, &[&atleast, "freetoken"]).is_err() {
        fail(&format!("freetoken {found} found by {tool}, but these declarations need {MIN_VERSION} or newer"));
    }
    println!("cargo:version={found}");

    // Every -L folder and -l library of `--libs` goes to the linker.
    let libs = pkg_config(&tool, &["--libs", "freetoken"]).unwrap_or_else(|e| fail(&e));
    for flag in libs.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
    if let Ok(inc) = pkg_config(&tool, &["--variable=includedir", "freetoken"]) {
        let inc = PathBuf::from(&inc);
        println!("cargo:include={}", inc.canonicalize().unwrap_or(inc).display());
    }
    PathBuf::from(pkg_config(&tool, &["--variable=libdir", "freetoken"]).unwrap_or_else(|e| fail(&e)))
}
