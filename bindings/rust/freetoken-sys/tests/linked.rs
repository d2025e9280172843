//! The declarations against the library they link: each *_params_init writes the C struct's
//! size into struct_size, which must equal the Rust struct's size, and the loaded library is at
//! least the version the declarations describe.
use freetoken_sys::*;
use std::ffi::CStr;
use std::mem::{size_of, MaybeUninit};

macro_rules! init_size {
    ($init:ident, $t:ty) => {{
        let mut v = MaybeUninit::<$t>::zeroed();
        // SAFETY: the init functions write every field of the struct they are given.
        let v = unsafe {
            $init(v.as_mut_ptr());
            v.assume_init()
        };
        assert_eq!(v.struct_size as usize, size_of::<$t>(), "{} of the library vs Rust", stringify!($t));
    }};
}

#[test]
fn params_structs_have_the_library_sizes() {
    init_size!(ft_engine_params_init, ft_engine_params);
    init_size!(ft_model_load_params_init, ft_model_load_params);
    init_size!(ft_model_desc_init, ft_model_desc);
    init_size!(ft_session_params_init, ft_session_params);
    init_size!(ft_profile_params_init, ft_profile_params);
    init_size!(ft_ep_params_init, ft_ep_params);
}

#[test]
fn loaded_library_is_at_least_these_declarations() {
    let loaded = unsafe { ft_version_number() };
    assert!(loaded >= FT_VERSION_NUMBER, "library {loaded} is older than the declarations {FT_VERSION_NUMBER}");
    assert_eq!(loaded / 10000, FT_VERSION_MAJOR);
    let text = unsafe { CStr::from_ptr(ft_version_string()) }.to_str().unwrap();
    assert_eq!(text, format!("{}.{}.{}", loaded / 10000, loaded / 100 % 100, loaded % 100));
}

#[test]
fn status_names_match_the_constants() {
    let cases = [
        (FT_OK, "FT_OK"),
        (FT_ERR_INVALID_ARGUMENT, "FT_ERR_INVALID_ARGUMENT"),
        (FT_ERR_NON_FINITE, "FT_ERR_NON_FINITE"),
        (FT_ERR_INTERNAL, "FT_ERR_INTERNAL"),
        (9999, "FT_ERR_UNKNOWN"),
    ];
    for (status, name) in cases {
        let got = unsafe { CStr::from_ptr(ft_status_string(status)) };
        assert_eq!(got.to_str().unwrap(), name);
    }
}

#[test]
fn build_info_fills_what_struct_size_allows() {
    let mut info = MaybeUninit::<ft_build_info>::zeroed();
    unsafe { (*info.as_mut_ptr()).struct_size = size_of::<ft_build_info>() as u32 };
    assert_eq!(unsafe { ft_build_info_get(info.as_mut_ptr()) }, FT_OK);
    let info = unsafe { info.assume_init() };
    assert_eq!(info.version_number, unsafe { ft_version_number() });
    assert!(!info.cpu_isa.is_null() && !info.compiler.is_null());

    let mut small = MaybeUninit::<ft_build_info>::zeroed();
    unsafe { (*small.as_mut_ptr()).struct_size = 4 };
    assert_eq!(unsafe { ft_build_info_get(small.as_mut_ptr()) }, FT_ERR_INVALID_ARGUMENT);
}
