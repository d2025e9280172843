//! Run path: the program finds libfreetoken in the folder freetoken-sys linked it from
//! (DEP_FREETOKEN_LIBDIR), so it runs from any install prefix without LD_LIBRARY_PATH. A program
//! whose library sits in a folder the loader already searches (after `ldconfig`) needs none.
fn main() {
    if let Ok(dir) = std::env::var("DEP_FREETOKEN_LIBDIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
}
