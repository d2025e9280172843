//! The bandwidth profile of a machine and the format choices it implies.

use std::path::Path;
use std::ptr::{self, NonNull};

use crate::sys;
use crate::error::{Error, Result, Status};
use crate::util::{check, defaults, invalid, path_cstring, sized, string_of, to_i32, with_err_buf};
use crate::enums::{Device, Format};
use crate::progress::{ProgressFn, with_progress};

/// Options of [`Profile::measure`]; `default()` holds the library's defaults.
pub struct ProfileOptions<'a> {
    pub device: Device,
    /// 0 (default): as engines choose.
    pub cpu_threads: usize,
    /// Formats to measure; empty (default): every format.
    pub formats: Vec<Format>,
    /// Soft bound on the whole run (default 30).
    pub max_seconds: f64,
    /// Called with (phase, done, total); return false to cancel.
    pub progress: Option<ProgressFn<'a>>,
}

impl Default for ProfileOptions<'_> {
    fn default() -> Self {
        let p = defaults(sys::ft_profile_params_init);
        ProfileOptions {
            device: Device::from_raw(p.device),
            cpu_threads: p.cpu_threads.max(0) as usize,
            formats: Vec::new(),
            max_seconds: p.max_seconds,
            progress: None,
        }
    }
}

/// Machine figures of a profile.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProfileMachine {
    pub physical_cores: i32,
    pub threads_used: i32,
    pub cpu_read_gbs: f64,
    pub h2d_gbs: f64,
    pub d2h_gbs: f64,
    pub gpu_name: String,
    pub cpu_model: String,
}

/// Figures of one expert format in a profile.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProfileFormat {
    pub format: Format,
    pub expert_bytes: u64,
    pub cpu_gbs: f64,
    pub gather_gbs: f64,
    pub cpu_overlap_gbs: f64,
    pub gather_overlap_gbs: f64,
    /// Share of a step's misses to fetch over PCIe; None when the figures do not tell.
    pub fetch_fraction: Option<f64>,
    pub cpu_kernel: String,
}

/// What this machine's memory, bus and kernels do: measured, or read from a saved profile.
/// Immutable (`Send + Sync`).
///
/// ```
/// use freetoken::{Device, Format, Profile, ProfileOptions, Status};
/// // Cancelled by its progress closure at the first report.
/// let mut stop = |_phase: &str, _done: u64, _total: u64| false;
/// let options = ProfileOptions { device: Device::CpuOnly, formats: vec![Format::BF16], progress: Some(&mut stop),
///                                ..Default::default() };
/// assert_eq!(Profile::measure(options).err().map(|e| e.status()), Some(Status::CANCELLED));
/// // A missing file is an I/O error.
/// assert_eq!(Profile::load(Some("/no/such/profile.json".as_ref())).err().map(|e| e.status()), Some(Status::IO));
/// ```
pub struct Profile {
    raw: NonNull<sys::ft_profile>,
}

// SAFETY: the header's threading contract: a profile is immutable once made and may be read
// from any number of threads.
unsafe impl Send for Profile {}
unsafe impl Sync for Profile {}

impl Profile {
    /// Measures the machine (`ft_profile_bandwidth`).
    pub fn measure(options: ProfileOptions<'_>) -> Result<Profile> {
        let mut p = defaults(sys::ft_profile_params_init);
        p.device = options.device.raw();
        p.cpu_threads = to_i32(options.cpu_threads, "cpu_threads")?;
        p.formats = 0;
        for f in &options.formats {
            if !(0..32).contains(&f.0) {
                return Err(invalid(format!("format {f:?} has no bit in the formats mask")));
            }
            p.formats |= 1u32 << f.0;
        }
        p.max_seconds = options.max_seconds;
        let mut raw = ptr::null_mut();
        with_progress(options.progress, |cb, user| {
            p.progress = cb;
            p.progress_user_data = user;
            with_err_buf(|err, n| unsafe { sys::ft_profile_bandwidth(&p, &mut raw, err, n) })
        })?;
        Ok(Profile { raw: NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_profile_bandwidth gave NULL"))? })
    }

    /// Reads a profile; None: `$FT_PROFILE_PATH`, else the default cache path (`ft_profile_load`).
    pub fn load(path: Option<&Path>) -> Result<Profile> {
        let cpath = path.map(path_cstring).transpose()?;
        let mut raw = ptr::null_mut();
        with_err_buf(|err, n| unsafe {
            sys::ft_profile_load(cpath.as_ref().map_or(ptr::null(), |c| c.as_ptr()), &mut raw, err, n)
        })?;
        Ok(Profile { raw: NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_profile_load gave NULL"))? })
    }

    /// Writes the profile atomically; None: the default path (`ft_profile_save`).
    pub fn save(&self, path: Option<&Path>) -> Result<()> {
        let cpath = path.map(path_cstring).transpose()?;
        with_err_buf(|err, n| unsafe {
            sys::ft_profile_save(self.raw.as_ptr(), cpath.as_ref().map_or(ptr::null(), |c| c.as_ptr()), err, n)
        })
    }

    pub fn machine(&self) -> Result<ProfileMachine> {
        let mut m: sys::ft_profile_machine = sized();
        let s = unsafe { sys::ft_profile_get_machine(self.raw.as_ptr(), &mut m) };
        check(s, || "ft_profile_get_machine failed".to_string())?;
        // SAFETY: the strings live as long as the profile and are copied here.
        unsafe {
            Ok(ProfileMachine {
                physical_cores: m.physical_cores,
                threads_used: m.threads_used,
                cpu_read_gbs: m.cpu_read_gbs,
                h2d_gbs: m.h2d_gbs,
                d2h_gbs: m.d2h_gbs,
                gpu_name: string_of(m.gpu_name),
                cpu_model: string_of(m.cpu_model),
            })
        }
    }

    /// Figures of one format; [`Status::UNSUPPORTED`] when the profile has none for it.
    pub fn format(&self, format: Format) -> Result<ProfileFormat> {
        let mut f: sys::ft_profile_format = sized();
        let s = unsafe { sys::ft_profile_get_format(self.raw.as_ptr(), format.0, &mut f) };
        check(s, || format!("the profile has no figures for {format:?}"))?;
        Ok(ProfileFormat {
            format: Format(f.format),
            expert_bytes: f.expert_bytes,
            cpu_gbs: f.cpu_gbs,
            gather_gbs: f.gather_gbs,
            cpu_overlap_gbs: f.cpu_overlap_gbs,
            gather_overlap_gbs: f.gather_overlap_gbs,
            fetch_fraction: if f.fetch_fraction < 0.0 { None } else { Some(f.fetch_fraction) },
            // SAFETY: lives as long as the profile; copied here.
            cpu_kernel: unsafe { string_of(f.cpu_kernel) },
        })
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        unsafe { sys::ft_profile_free(self.raw.as_ptr()) }
    }
}
