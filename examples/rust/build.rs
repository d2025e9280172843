//! Links libfreetoken: from FREETOKEN_LIB_DIR when set, else through the `pkg-config` command
//! (no crates, so the example builds offline).
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=FREETOKEN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");

    if let Some(dir) = env::var_os("FREETOKEN_LIB_DIR") {
        println!("cargo:rustc-link-search=native={}", dir.to_string_lossy());
        println!("cargo:rustc-link-lib=dylib=freetoken");
        return;
    }
    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&pkg_config)
        .args(["--libs", "freetoken"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {pkg_config}: {e}; set FREETOKEN_LIB_DIR instead"));
    if !out.status.success() {
        panic!(
            "{pkg_config} --libs freetoken failed (set PKG_CONFIG_PATH or FREETOKEN_LIB_DIR): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}
