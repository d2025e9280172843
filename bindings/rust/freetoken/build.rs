//! Run path for this crate's own tests, examples and doc tests: the library folder that
//! freetoken-sys found (DEP_FREETOKEN_LIBDIR). Link arguments of a library crate do not reach
//! the binaries of crates that depend on it; those add their own (see the README).
fn main() {
    if let Ok(dir) = std::env::var("DEP_FREETOKEN_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
