//! A Rust program using libfreetoken through the `freetoken` crate: builds a small MoE layer
//! from memory, routes random router logits and decodes a batch, like examples/c/decode.c.
//! Build against an installed library (Rust 1.63 or newer, no crates.io):
//!   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cargo build --offline --release
//! build.rs gives the program a run path to the library's folder.
use freetoken::{
    Backend, Bf16, Engine, EngineParams, ModelBuilder, ModelDesc, Projection, Session, SessionParams, Status,
};
use std::fmt;

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

fn fail(msg: impl fmt::Display) -> ! {
    eprintln!("decode: {msg}");
    std::process::exit(1)
}

fn run() -> freetoken::Result<()> {
    println!("libfreetoken {}", freetoken::version_string());
    if freetoken::version().0 != 0 {
        fail("this program is written for major version 0");
    }
    let engine = Engine::new(&EngineParams::default())?;
    let einfo = engine.info()?;
    println!("engine: {} worker threads, cpu {}", einfo.cpu_threads, einfo.cpu_isa);

    let desc = ModelDesc { num_layers: 2, num_experts: 16, top_k: 4, hidden_size: 256, intermediate_size: 128, ..Default::default() };
    let mut rng = Rng(12345);
    let mut builder = ModelBuilder::new(&engine, &desc)?;
    let mut w = vec![Bf16::default(); desc.hidden_size * desc.intermediate_size];
    for l in 0..desc.num_layers as i32 {
        for e in 0..desc.num_experts as i32 {
            for p in [Projection::GATE, Projection::UP, Projection::DOWN] {
                w.iter_mut().for_each(|v| *v = Bf16::from_f32(0.08 * rng.uniform()));
                builder.set_expert(l, e, p, &w)?;
            }
        }
    }
    let model = builder.finalize()?;
    let info = model.info()?;

    let mut session = Session::new(&model, &SessionParams { backend: Backend::CPU, max_tokens: 8, ..Default::default() })?;
    if session.backend() != Backend::CPU {
        fail(format!("session backend {:?} is not CPU", session.backend()));
    }
    let (t, e, k, h) = (4usize, info.num_experts, info.top_k, info.hidden_size);
    let logits: Vec<f32> = (0..t * e).map(|_| 2.0 * rng.uniform()).collect();
    let x: Vec<Bf16> = (0..t * h).map(|_| Bf16::from_f32(rng.uniform())).collect();
    let (mut ids, mut weights, mut y) = (vec![0i32; t * k], vec![0f32; t * k], vec![Bf16::default(); t * h]);
    for layer in 0..info.num_layers as i32 {
        session.route(layer, &logits, &mut ids, &mut weights)?;
        let sum: f32 = weights[..k].iter().sum();
        if (sum - 1.0).abs() > 1e-5 {
            fail(format!("routing weights sum to {sum}, not 1"));
        }
        session.decode(layer, &x, &ids, &weights, &mut y)?;
        let mut norm = 0.0f64;
        for v in &y {
            let f = v.to_f32();
            if !f.is_finite() {
                fail("non-finite output");
            }
            norm += f as f64 * f as f64;
        }
        let routes: Vec<String> = (0..k).map(|i| format!("{}({:.3})", ids[i], weights[i])).collect();
        println!("layer {layer}: token 0 -> experts {}, |out| = {:.4}", routes.join(" "), norm.sqrt());
        if norm == 0.0 {
            fail("output is all zeros");
        }
    }
    let st = session.stats()?;
    println!("{} routes, {} distinct expert reads, {:.1} MB read", st.routes_cpu, st.experts_cpu, st.cpu_bytes as f64 / 1e6);
    let layers = info.num_layers as u64;
    if st.decode_calls != layers || st.tokens != layers * t as u64 || st.routes_cpu != layers * (t * k) as u64 {
        fail(format!("unexpected stats {st:?}"));
    }

    // Bad input comes back as a status with text, not a crash.
    let bad = vec![e as i32; t * k];
    match session.decode(0, &x, &bad, &weights, &mut y) {
        Err(err) if err.status() == Status::INVALID_ARGUMENT && !err.message().is_empty() => println!("error text: {err}"),
        Err(err) => fail(format!("bad id gave {err}, not FT_ERR_INVALID_ARGUMENT with text")),
        Ok(()) => fail("a bad expert id was accepted"),
    }
    Ok(())
}

fn main() {
    if let Err(err) = run() {
        fail(err);
    }
}
