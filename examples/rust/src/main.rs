//! A Rust consumer of libfreetoken: builds a small MoE layer from memory, routes random router
//! logits and decodes a batch, like examples/c/decode.c. Build against an installed library:
//!   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cargo build --offline --release
//! (or FREETOKEN_LIB_DIR=PREFIX/lib) and run with the library on the loader path.
mod ffi;

use std::ffi::{c_char, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::mem::{size_of, size_of_val, MaybeUninit};
use std::ptr;

/// A failed call: its status, the status's name and the library's error text.
#[derive(Debug)]
pub struct Error {
    pub status: ffi::ft_status,
    pub message: String,
}

impl Error {
    fn name(&self) -> String {
        // SAFETY: ft_status_string returns a static, never-NULL string.
        unsafe { cstr(ffi::ft_status_string(self.status)) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name(), self.message)
    }
}

impl std::error::Error for Error {}

type Result<T> = std::result::Result<T, Error>;

/// Copies a library string (NULL reads as "").
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Turns a status into a Result, reading the error text only on failure (it is valid until the
/// next call on the handle, so it is copied at once).
fn check(status: ffi::ft_status, text: impl FnOnce() -> String) -> Result<()> {
    if status == ffi::FT_OK {
        Ok(())
    } else {
        Err(Error {
            status,
            message: text(),
        })
    }
}

/// Creation calls report into a caller buffer: runs `f(err, err_size)` with one.
fn with_err_buf(f: impl FnOnce(*mut c_char, usize) -> ffi::ft_status) -> Result<()> {
    let mut err = [0 as c_char; 256];
    let status = f(err.as_mut_ptr(), err.len());
    // SAFETY: the library NUL-terminates what it writes; the buffer starts zeroed.
    check(status, || unsafe { cstr(err.as_ptr()) })
}

/// Output structs (info, stats): zeroed, struct_size set, filled by the library.
fn sized<T>(set_size: impl FnOnce(&mut T, u32)) -> T {
    // SAFETY: every output struct is plain data for which all-zero bytes are valid.
    let mut v: T = unsafe { std::mem::zeroed() };
    set_size(&mut v, size_of::<T>() as u32);
    v
}

pub struct Engine {
    raw: *mut ffi::ft_engine,
}

impl Engine {
    pub fn new(params: Option<&ffi::ft_engine_params>) -> Result<Engine> {
        let mut raw = ptr::null_mut();
        let p = params.map_or(ptr::null(), |p| p as *const _);
        with_err_buf(|err, n| unsafe { ffi::ft_engine_create(p, &mut raw, err, n) })?;
        Ok(Engine { raw })
    }

    pub fn info(&self) -> Result<ffi::ft_engine_info> {
        let mut info: ffi::ft_engine_info = sized(|i: &mut ffi::ft_engine_info, n| i.struct_size = n);
        let s = unsafe { ffi::ft_engine_get_info(self.raw, &mut info) };
        check(s, || unsafe { cstr(ffi::ft_engine_last_error(self.raw)) })?;
        Ok(info)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        unsafe { ffi::ft_engine_free(self.raw) }
    }
}

/// A model borrows its engine, which must outlive it.
pub struct Model<'e> {
    raw: *mut ffi::ft_model,
    _engine: PhantomData<&'e Engine>,
}

impl<'e> Model<'e> {
    pub fn create(engine: &'e Engine, desc: &ffi::ft_model_desc) -> Result<Model<'e>> {
        let mut raw = ptr::null_mut();
        with_err_buf(|err, n| unsafe { ffi::ft_model_create(engine.raw, desc, &mut raw, err, n) })?;
        Ok(Model {
            raw,
            _engine: PhantomData,
        })
    }

    fn check(&self, status: ffi::ft_status) -> Result<()> {
        check(status, || unsafe { cstr(ffi::ft_model_last_error(self.raw)) })
    }

    pub fn set_expert(&mut self, layer: i32, expert: i32, proj: i32, bf16: &[u16]) -> Result<()> {
        let s = unsafe {
            ffi::ft_model_set_expert(
                self.raw,
                layer,
                expert,
                proj,
                bf16.as_ptr().cast(),
                size_of_val(bf16),
            )
        };
        self.check(s)
    }

    pub fn finalize(&mut self) -> Result<()> {
        let s = unsafe { ffi::ft_model_finalize(self.raw) };
        self.check(s)
    }

    pub fn info(&self) -> Result<ffi::ft_model_info> {
        let mut info: ffi::ft_model_info = sized(|i: &mut ffi::ft_model_info, n| i.struct_size = n);
        let s = unsafe { ffi::ft_model_get_info(self.raw, &mut info) };
        self.check(s)?;
        Ok(info)
    }
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        unsafe { ffi::ft_model_free(self.raw) }
    }
}

/// A session borrows its model, which must outlive it. Used by one thread at a time: the raw
/// pointer keeps it !Send and !Sync.
pub struct Session<'m> {
    raw: *mut ffi::ft_session,
    experts: usize,
    top_k: usize,
    hidden: usize,
    _model: PhantomData<&'m Model<'m>>,
}

impl<'m> Session<'m> {
    pub fn create(model: &'m Model<'_>, params: Option<&ffi::ft_session_params>) -> Result<Session<'m>> {
        let info = model.info()?;
        let mut raw = ptr::null_mut();
        let p = params.map_or(ptr::null(), |p| p as *const _);
        with_err_buf(|err, n| unsafe { ffi::ft_session_create(model.raw, p, &mut raw, err, n) })?;
        Ok(Session {
            raw,
            experts: info.num_experts as usize,
            top_k: info.top_k as usize,
            hidden: info.hidden_size as usize,
            _model: PhantomData,
        })
    }

    fn check(&self, status: ffi::ft_status) -> Result<()> {
        check(status, || unsafe { cstr(ffi::ft_session_last_error(self.raw)) })
    }

    pub fn backend(&self) -> i32 {
        unsafe { ffi::ft_session_backend(self.raw) }
    }

    /// logits [T, E] -> ids [T, K], weights [T, K]. The library reads and writes exactly these
    /// shapes, so the slice lengths are checked here rather than trusted.
    pub fn route(&mut self, layer: i32, logits: &[f32], ids: &mut [i32], weights: &mut [f32]) -> Result<()> {
        let t = logits.len() / self.experts;
        assert!(
            logits.len() == t * self.experts && ids.len() == t * self.top_k && weights.len() == ids.len()
        );
        let s = unsafe {
            ffi::ft_route(
                self.raw,
                layer,
                t as i32,
                logits.as_ptr(),
                ids.as_mut_ptr(),
                weights.as_mut_ptr(),
            )
        };
        self.check(s)
    }

    /// hidden [T, H] bf16, ids and weights [T, K] -> out [T, H] bf16.
    pub fn decode(
        &mut self,
        layer: i32,
        hidden: &[u16],
        ids: &[i32],
        weights: &[f32],
        out: &mut [u16],
    ) -> Result<()> {
        let t = hidden.len() / self.hidden;
        assert!(hidden.len() == t * self.hidden && out.len() == hidden.len());
        assert!(ids.len() == t * self.top_k && weights.len() == ids.len());
        let s = unsafe {
            ffi::ft_decode(
                self.raw,
                layer,
                t as i32,
                hidden.as_ptr(),
                ids.as_ptr(),
                weights.as_ptr(),
                out.as_mut_ptr(),
            )
        };
        self.check(s)
    }

    pub fn stats(&self) -> Result<ffi::ft_session_stats> {
        let mut st: ffi::ft_session_stats = sized(|s: &mut ffi::ft_session_stats, n| s.struct_size = n);
        let s = unsafe { ffi::ft_session_get_stats(self.raw, &mut st) };
        self.check(s)?;
        Ok(st)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        unsafe { ffi::ft_session_free(self.raw) }
    }
}

/// xorshift32 in [-1, 1), the same stream as decode.c.
struct Rng(u32);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        (self.0 >> 8) as f32 / 8388608.0 - 1.0
    }
}

fn to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

fn fail(msg: impl fmt::Display) -> ! {
    eprintln!("decode: {msg}");
    std::process::exit(1)
}

fn run() -> Result<()> {
    let version = unsafe { cstr(ffi::ft_version_string()) };
    println!("libfreetoken {version}");
    if unsafe { ffi::ft_version_number() } / 10000 != 0 {
        fail("these declarations are for major version 0");
    }

    let mut ep = MaybeUninit::<ffi::ft_engine_params>::uninit();
    // SAFETY: *_params_init writes every field.
    let ep = unsafe {
        ffi::ft_engine_params_init(ep.as_mut_ptr());
        ep.assume_init()
    };
    if ep.struct_size as usize != size_of::<ffi::ft_engine_params>() || ep.device != ffi::FT_DEVICE_AUTO {
        fail(format!("ft_engine_params_init: unexpected defaults {ep:?}"));
    }
    let engine = Engine::new(Some(&ep))?;
    let einfo = engine.info()?;
    println!("engine: {} worker threads, cpu {}", einfo.cpu_threads, unsafe {
        cstr(einfo.cpu_isa)
    });

    let mut desc = MaybeUninit::<ffi::ft_model_desc>::uninit();
    let mut desc = unsafe {
        ffi::ft_model_desc_init(desc.as_mut_ptr());
        desc.assume_init()
    };
    if desc.format != ffi::FT_FORMAT_BF16 || desc.routing != ffi::FT_ROUTING_SOFTMAX_TOPK_RENORM {
        fail(format!("ft_model_desc_init: unexpected defaults {desc:?}"));
    }
    desc.num_layers = 2;
    desc.num_experts = 16;
    desc.top_k = 4;
    desc.hidden_size = 256;
    desc.intermediate_size = 128;

    let mut rng = Rng(12345);
    let mut model = Model::create(&engine, &desc)?;
    let mut w = vec![0u16; (desc.hidden_size * desc.intermediate_size) as usize];
    for l in 0..desc.num_layers {
        for e in 0..desc.num_experts {
            for p in [ffi::FT_PROJ_GATE, ffi::FT_PROJ_UP, ffi::FT_PROJ_DOWN] {
                w.iter_mut().for_each(|v| *v = to_bf16(0.08 * rng.uniform()));
                model.set_expert(l, e, p, &w)?;
            }
        }
    }
    model.finalize()?;
    let info = model.info()?;

    let mut sp = MaybeUninit::<ffi::ft_session_params>::uninit();
    let mut sp = unsafe {
        ffi::ft_session_params_init(sp.as_mut_ptr());
        sp.assume_init()
    };
    sp.backend = ffi::FT_BACKEND_CPU;
    sp.max_tokens = 8;
    let mut session = Session::create(&model, Some(&sp))?;
    if session.backend() != ffi::FT_BACKEND_CPU {
        fail(format!(
            "session backend {} is not FT_BACKEND_CPU",
            session.backend()
        ));
    }

    let (t, e, k, h) = (
        4usize,
        info.num_experts as usize,
        info.top_k as usize,
        info.hidden_size as usize,
    );
    let logits: Vec<f32> = (0..t * e).map(|_| 2.0 * rng.uniform()).collect();
    let x: Vec<u16> = (0..t * h).map(|_| to_bf16(rng.uniform())).collect();
    let (mut ids, mut weights, mut y) = (vec![0i32; t * k], vec![0f32; t * k], vec![0u16; t * h]);

    for layer in 0..info.num_layers {
        session.route(layer, &logits, &mut ids, &mut weights)?;
        let sum: f32 = weights[..k].iter().sum();
        if (sum - 1.0).abs() > 1e-5 {
            fail(format!("routing weights sum to {sum}, not 1"));
        }
        session.decode(layer, &x, &ids, &weights, &mut y)?;
        let mut norm = 0.0f64;
        for &v in &y {
            let f = from_bf16(v);
            if !f.is_finite() {
                fail("non-finite output");
            }
            norm += f as f64 * f as f64;
        }
        let routes: Vec<String> = (0..k).map(|i| format!("{}({:.3})", ids[i], weights[i])).collect();
        println!(
            "layer {layer}: token 0 -> experts {}, |out| = {:.4}",
            routes.join(" "),
            norm.sqrt()
        );
        if norm == 0.0 {
            fail("output is all zeros");
        }
    }

    let st = session.stats()?;
    println!(
        "{} routes, {} distinct expert reads, {:.1} MB read",
        st.routes_cpu,
        st.experts_cpu,
        st.cpu_bytes as f64 / 1e6
    );
    let layers = info.num_layers as u64;
    if st.decode_calls != layers || st.tokens != layers * t as u64 || st.routes_cpu != layers * (t * k) as u64
    {
        fail(format!("unexpected stats {st:?}"));
    }

    // Bad input comes back as a status with text, not a crash.
    let bad = vec![e as i32; t * k];
    match session.decode(0, &x, &bad, &weights, &mut y) {
        Err(err) if err.status == ffi::FT_ERR_INVALID_ARGUMENT && !err.message.is_empty() => {
            println!("error text: {err}")
        }
        Err(err) => fail(format!(
            "bad id gave {err}, not FT_ERR_INVALID_ARGUMENT with text"
        )),
        Ok(()) => fail("a bad expert id was accepted"),
    }
    Ok(())
}

fn main() {
    if let Err(err) = run() {
        fail(err);
    }
}
