//! The safe API against the linked library: results against a reference computed here, length
//! checks, errors with their statuses and messages, callbacks, and the threading contract.
use freetoken::ep::{EpGroup, EpParams, EpWire};
use freetoken::*;
use std::sync::{Arc, Mutex};

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

/// xorshift32 in [-1, 1).
struct Rng(u32);
impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        (self.0 >> 8) as f32 / 8388608.0 - 1.0
    }
}

const L: usize = 2;
const E: usize = 8;
const K: usize = 2;
const H: usize = 64;
const I: usize = 32;

/// Weights [layer][expert][proj] of a small model, and the model built from them.
fn weights() -> Vec<Vec<[Vec<Bf16>; 3]>> {
    let mut rng = Rng(7);
    let mut gen = |n: usize| (0..n).map(|_| Bf16::from_f32(0.1 * rng.uniform())).collect::<Vec<_>>();
    (0..L).map(|_| (0..E).map(|_| [gen(I * H), gen(I * H), gen(H * I)]).collect()).collect()
}

fn build<'e>(engine: &'e Engine, w: &[Vec<[Vec<Bf16>; 3]>]) -> Result<Model<'e>> {
    let desc = ModelDesc { num_layers: L, num_experts: E, top_k: K, hidden_size: H, intermediate_size: I, ..ModelDesc::default() };
    let mut b = ModelBuilder::new(engine, &desc)?;
    for (l, layer) in w.iter().enumerate() {
        for (e, ex) in layer.iter().enumerate() {
            for (p, proj) in [Projection::GATE, Projection::UP, Projection::DOWN].into_iter().zip(ex.iter()) {
                b.set_expert(l as i32, e as i32, p, proj)?;
            }
        }
    }
    b.finalize()
}

fn engine() -> Engine {
    Engine::new(&EngineParams { device: Device::CpuOnly, cpu_threads: 2, pin_threads: false, ..Default::default() }).unwrap()
}

/// out[t] = sum_k w[t,k] * down(silu(gate x) * up x), in f32 from the bf16 inputs.
fn reference(w: &[[Vec<Bf16>; 3]], x: &[Bf16], ids: &[i32], wts: &[f32]) -> Vec<f32> {
    let t = x.len() / H;
    let mut out = vec![0f32; t * H];
    for tok in 0..t {
        let xs: Vec<f32> = x[tok * H..(tok + 1) * H].iter().map(|v| v.to_f32()).collect();
        for k in 0..K {
            let [g, u, d] = &w[ids[tok * K + k] as usize];
            let act: Vec<f32> = (0..I)
                .map(|i| {
                    let gv: f32 = (0..H).map(|h| g[i * H + h].to_f32() * xs[h]).sum();
                    let uv: f32 = (0..H).map(|h| u[i * H + h].to_f32() * xs[h]).sum();
                    gv / (1.0 + (-gv).exp()) * uv
                })
                .collect();
            for h in 0..H {
                let dv: f32 = (0..I).map(|i| d[h * I + i].to_f32() * act[i]).sum();
                out[tok * H + h] += wts[tok * K + k] * dv;
            }
        }
    }
    out
}

#[test]
fn handles_are_send_and_sync_as_the_header_says() {
    assert_send_sync::<Engine>();
    assert_send_sync::<Model<'static>>();
    assert_send_sync::<Profile>();
    assert_send::<Session<'static>>();
    assert_send::<EpGroup>();
}

#[test]
fn bf16_rounds_to_nearest_even() {
    assert_eq!(Bf16::from_f32(1.0).to_bits(), 0x3f80);
    assert_eq!(Bf16::from_f32(-2.0).to_bits(), 0xc000);
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even pattern (1.0).
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_bits(), 0x3f80);
    assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).to_bits(), 0x3f82);
    assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
    assert_eq!(Bf16::from_f32(0.1).to_f32(), 0.10009765625);
    assert_eq!(std::mem::size_of::<Bf16>(), 2);
}

#[test]
fn version_and_build_info() {
    let (major, minor, patch) = version();
    assert_eq!(version_string(), format!("{major}.{minor}.{patch}"));
    let info = build_info().unwrap();
    assert_eq!(info.version_number, major * 10000 + minor * 100 + patch);
    assert!(!info.cpu_isa.is_empty());
    assert_eq!(Status::FORMAT.name(), "FT_ERR_FORMAT");
    assert_eq!(Status(999).name(), "FT_ERR_UNKNOWN");
    let e = Error::new(Status::IO, "file gone");
    assert_eq!(e.to_string(), "FT_ERR_IO: file gone");
}

#[test]
fn defaults_come_from_the_library() {
    let e = EngineParams::default();
    assert_eq!((e.device, e.cpu_threads, e.pin_threads), (Device::Auto, 0, true));
    let d = ModelDesc::default();
    assert_eq!((d.format, d.routing, d.activation), (Format::BF16, Routing::SOFTMAX_TOPK_RENORM, Activation::SILU));
    let s = SessionParams::default();
    assert_eq!((s.backend, s.max_tokens, s.check_finite), (Backend::AUTO, 256, true));
    assert_eq!((s.cache_policy, s.cache_half_life), (CachePolicy::AUTO, 0));
    let p = EpParams::default();
    assert_eq!((p.top_k, p.wire, p.combine_wire), (8, EpWire::FP8, EpWire::BF16));
}

#[test]
fn engine_info_reports_what_was_asked() {
    let engine = engine();
    let info = engine.info().unwrap();
    assert_eq!(info.device, None);
    assert_eq!(info.cpu_threads, 2);
    assert!(info.physical_cores >= 1);
}

#[test]
fn route_and_decode_match_a_reference() {
    let engine = engine();
    let w = weights();
    let model = build(&engine, &w).unwrap();
    let info = model.info().unwrap();
    assert_eq!((info.num_layers, info.num_experts, info.top_k, info.hidden_size), (L, E, K, H));
    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, max_tokens: 8, ..Default::default() }).unwrap();
    assert_eq!(s.backend(), Backend::CPU);
    assert_eq!(s.cache_policy(), None);  // the cpu backend has no slot cache
    assert!(!s.backend_reason().is_empty());

    let t = 3;
    let mut rng = Rng(99);
    let logits: Vec<f32> = (0..t * E).map(|_| 3.0 * rng.uniform()).collect();
    let x: Vec<Bf16> = (0..t * H).map(|_| Bf16::from_f32(rng.uniform())).collect();
    let (mut ids, mut wts, mut y) = (vec![0i32; t * K], vec![0f32; t * K], vec![Bf16::default(); t * H]);
    for layer in 0..L {
        s.route(layer as i32, &logits, &mut ids, &mut wts).unwrap();
        for tok in 0..t {
            // softmax, top-k, renormalised: the two largest logits, weights by their softmax.
            let row = &logits[tok * E..(tok + 1) * E];
            let mut order: Vec<usize> = (0..E).collect();
            order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
            assert_eq!(&ids[tok * K..tok * K + K], &[order[0] as i32, order[1] as i32]);
            let (a, b) = (row[order[0]].exp(), row[order[1]].exp());
            assert!((wts[tok * K] - a / (a + b)).abs() < 1e-5);
        }
        s.decode(layer as i32, &x, &ids, &wts, &mut y).unwrap();
        let want = reference(&w[layer], &x, &ids, &wts);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0);
        for (got, want) in y.iter().zip(&want) {
            assert!((got.to_f32() - want).abs() <= 0.02 * scale, "{} vs {}", got.to_f32(), want);
        }
    }
    let st = s.stats().unwrap();
    assert_eq!((st.decode_calls, st.tokens, st.routes_cpu), (L as u64, (L * t) as u64, (L * t * K) as u64));
    assert_eq!(s.layer_stats(0).unwrap().calls, 0); // CPU backend: no slot cache figures
    s.reset_stats();
    assert_eq!(s.stats().unwrap().decode_calls, 0);
    assert!(s.status().is_ok());
}

#[test]
fn wrong_lengths_are_errors_not_accesses() {
    let engine = engine();
    let model = build(&engine, &weights()).unwrap();
    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, ..Default::default() }).unwrap();
    let bad = |r: Result<()>, what: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        assert!(e.message().contains(what), "{e}");
    };
    let logits = vec![0f32; 2 * E];
    bad(s.route(0, &logits, &mut [0; 2 * K - 1], &mut [0.0; 2 * K]), "expert_ids");
    bad(s.route(0, &logits, &mut [0; 2 * K], &mut [0.0; 3 * K]), "expert_weights");
    bad(s.route(0, &logits[1..], &mut [0; 2 * K], &mut [0.0; 2 * K]), "logits");
    bad(s.route(0, &[], &mut [], &mut []), "logits");
    let x = vec![Bf16::from_f32(1.0); 2 * H];
    let mut y = vec![Bf16::default(); 2 * H];
    bad(s.decode(0, &x, &[0; 2 * K], &[0.5; 2 * K], &mut y[1..]), "out");
    bad(s.decode(0, &x[..H + 1], &[0; 2 * K], &[0.5; 2 * K], &mut y), "hidden");
    bad(s.decode(0, &x, &[0; K], &[0.5; 2 * K], &mut y), "expert_ids");
    // Right lengths, bad values: the library's own status and message.
    let e = s.decode(0, &x, &[E as i32; 2 * K], &[0.5; 2 * K], &mut y).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    assert!(!e.message().is_empty() && !e.message().contains("elements"), "{e}");
    assert_eq!(s.decode(L as i32, &x, &[0; 2 * K], &[0.5; 2 * K], &mut y).unwrap_err().status(), Status::INVALID_ARGUMENT);
    let nan = vec![Bf16::from_f32(f32::NAN); 2 * H];
    assert_eq!(s.decode(0, &nan, &[0; 2 * K], &[0.5; 2 * K], &mut y).unwrap_err().status(), Status::NON_FINITE);

    let desc = ModelDesc { num_layers: 1, num_experts: E, top_k: K, hidden_size: H, intermediate_size: I, ..ModelDesc::default() };
    let mut b = ModelBuilder::new(&engine, &desc).unwrap();
    bad(b.set_expert(0, 0, Projection::GATE, &vec![Bf16::default(); H * I + 1]), "projection");
    bad(b.set_router_bias(0, &[0.0; E - 1]), "bias");
    // Right length, bad index: the library's message.
    let e = b.set_expert(0, E as i32, Projection::UP, &vec![Bf16::default(); H * I]).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    // Missing experts: finalize names one.
    let e = b.finalize().err().unwrap();
    assert_eq!(e.status(), Status::STATE);
    assert!(!e.message().is_empty());
}

#[test]
fn creation_errors_carry_the_library_message() {
    let engine = engine();
    let e = ModelBuilder::new(&engine, &ModelDesc::default()).err().unwrap();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    assert!(!e.message().is_empty());
    let e = Model::load(&engine, "/nonexistent/freetoken-checkpoint", LoadOptions::new()).err().unwrap();
    assert_eq!(e.status(), Status::IO);
    assert!(e.message().contains("/nonexistent/freetoken-checkpoint"), "{e}");
    let e = Model::load(&engine, "bad\0path", LoadOptions::new()).err().unwrap();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
}

#[test]
fn tensors_of_a_model_built_from_memory() {
    let engine = engine();
    let model = build(&engine, &weights()).unwrap();
    assert_eq!(model.tensor(0, TensorKind::ROUTER_WEIGHT).unwrap_err().status(), Status::UNSUPPORTED);
    assert_eq!(model.tensor(L as i32, TensorKind::ROUTER_WEIGHT).unwrap_err().status(), Status::INVALID_ARGUMENT);
    assert_eq!(model.tensor(0, TensorKind(99)).unwrap_err().status(), Status::INVALID_ARGUMENT);
}

#[test]
fn one_model_many_threads() {
    let engine = engine();
    let w = weights();
    let model = build(&engine, &w).unwrap();
    let x: Vec<Bf16> = (0..H).map(|i| Bf16::from_f32((i as f32 * 0.37).sin())).collect();
    let outs: Vec<Vec<Bf16>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                sc.spawn(|| {
                    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, ..Default::default() }).unwrap();
                    let mut y = vec![Bf16::default(); H];
                    for _ in 0..5 {
                        s.decode(1, &x, &[3, 5], &[0.25, 0.75], &mut y).unwrap();
                    }
                    y
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(outs.iter().all(|o| o == &outs[0]));
    assert!(outs[0].iter().any(|v| v.to_f32() != 0.0));
    // A session moves to another thread.
    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, ..Default::default() }).unwrap();
    let y = std::thread::scope(|sc| {
        sc.spawn(move || {
            let mut y = vec![Bf16::default(); H];
            s.decode(1, &x, &[3, 5], &[0.25, 0.75], &mut y).unwrap();
            y
        })
        .join()
        .unwrap()
    });
    assert_eq!(y, outs[0]);
}

#[test]
fn log_callback_receives_messages() {
    let seen = Arc::new(Mutex::new(Vec::<(LogLevel, String)>::new()));
    let sink = seen.clone();
    set_log_callback(LogLevel::DEBUG, move |level, msg| sink.lock().unwrap().push((level, msg.to_string())));
    let engine = engine();
    let model = build(&engine, &weights()).unwrap();
    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, ..Default::default() }).unwrap();
    let mut y = vec![Bf16::default(); H];
    let _ = s.decode(0, &vec![Bf16::default(); H], &[E as i32 + 40, 0], &[0.5, 0.5], &mut y);
    reset_log_callback(LogLevel::WARN);
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "no log line at debug level");
    assert!(seen.iter().any(|(l, m)| *l == LogLevel::DEBUG && m.contains("FT_ERR_INVALID_ARGUMENT")), "{seen:?}");
}

#[test]
fn profile_progress_can_cancel_and_panics_resume() {
    let mut calls = Vec::new();
    let mut stop = |phase: &str, done: u64, total: u64| {
        calls.push((phase.to_string(), done, total));
        false
    };
    let opts = ProfileOptions { device: Device::CpuOnly, formats: vec![Format::BF16], progress: Some(&mut stop), ..Default::default() };
    let e = Profile::measure(opts).err().unwrap();
    assert_eq!(e.status(), Status::CANCELLED);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "read");

    let mut boom = |_: &str, _: u64, _: u64| -> bool { panic!("from the progress closure") };
    let opts = ProfileOptions { device: Device::CpuOnly, formats: vec![Format::BF16], progress: Some(&mut boom), ..Default::default() };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Profile::measure(opts)));
    let msg = caught.err().unwrap();
    assert_eq!(msg.downcast_ref::<&str>(), Some(&"from the progress closure"));

    let e = Profile::load(Some(std::path::Path::new("/nonexistent/freetoken-profile.json"))).err().unwrap();
    assert_eq!(e.status(), Status::IO);
    assert!(!e.message().is_empty());
}

#[test]
fn ep_without_a_gpu_is_refused() {
    // Without CUDA in the build: UNSUPPORTED; with CUDA but no GPU: NO_DEVICE (or UNSUPPORTED where
    // NCCL is missing). Where a GPU and NCCL exist the group is made: the GPU tests cover that.
    let params = EpParams { num_experts: 8, hidden: 128, max_tokens: 16, ..Default::default() };
    let e = match EpGroup::bootstrap_local(&[0], &params) {
        Ok(_) => return,
        Err(e) => e,
    };
    let expected: &[Status] =
        if build_info().unwrap().cuda { &[Status::UNSUPPORTED, Status::NO_DEVICE] } else { &[Status::UNSUPPORTED] };
    assert!(expected.contains(&e.status()), "{}", e);
    assert!(!e.message().is_empty());
    let e = EpGroup::bootstrap(1, 0, 0, None, &params).err().unwrap();
    assert!(expected.contains(&e.status()) || e.status() == Status::INVALID_ARGUMENT, "{}", e);
}

/// Writes a small Mixtral-layout bf16 checkpoint (config.json + model.safetensors) into a fresh
/// folder: router weight element i of layer l is bf16(0.01 * (i % 7) - 0.03 + l), experts
/// hold w (layers[l][e][proj]).
fn write_checkpoint(w: &[Vec<[Vec<Bf16>; 3]>], tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("freetoken-rs-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "{{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"hidden_size\": {H}, \
         \"num_hidden_layers\": {L}, \"num_experts_per_tok\": {K}, \"num_local_experts\": {E}, \
         \"intermediate_size\": {I}, \"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"}}"
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut tensors: Vec<(String, [usize; 2], Vec<Bf16>)> = Vec::new();
    for (l, layer) in w.iter().enumerate() {
        let p = format!("model.layers.{l}.block_sparse_moe.");
        let router = (0..E * H).map(|i| Bf16::from_f32(0.01 * (i % 7) as f32 - 0.03 + l as f32)).collect();
        tensors.push((format!("{p}gate.weight"), [E, H], router));
        for (e, ex) in layer.iter().enumerate() {
            for (name, proj, shape) in [("w1", &ex[0], [I, H]), ("w3", &ex[1], [I, H]), ("w2", &ex[2], [H, I])] {
                tensors.push((format!("{p}experts.{e}.{name}.weight"), shape, proj.clone()));
            }
        }
    }
    let (mut header, mut data, mut off) = (Vec::new(), Vec::new(), 0usize);
    for (name, shape, values) in &tensors {
        let n = values.len() * 2;
        header.push(format!(
            "\"{name}\": {{\"dtype\": \"BF16\", \"shape\": [{}, {}], \"data_offsets\": [{off}, {}]}}",
            shape[0],
            shape[1],
            off + n
        ));
        values.iter().for_each(|v| data.extend_from_slice(&v.to_bits().to_le_bytes()));
        off += n;
    }
    let header = format!("{{{}}}", header.join(", "));
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    dir
}

#[test]
fn load_a_checkpoint_with_progress() {
    let engine = engine();
    let w = weights();
    let dir = write_checkpoint(&w, "load");
    let mut reports = Vec::new();
    let mut progress = |phase: &str, done: u64, total: u64| {
        reports.push((phase.to_string(), done, total));
        true
    };
    let model = Model::load(&engine, &dir, LoadOptions::new().io_threads(1).progress(&mut progress)).unwrap();
    assert!(!reports.is_empty());
    let (_, last_done, last_total) = reports.last().cloned().unwrap();
    assert!(last_total > 0 && last_done == last_total, "{reports:?}");
    assert!(reports.windows(2).all(|p| p[0].1 <= p[1].1));
    let info = model.info().unwrap();
    assert_eq!((info.architecture.as_str(), info.num_layers, info.num_experts, info.top_k), ("mixtral", L, E, K));
    assert_eq!((model.moe_layer(1), model.moe_layer(L as i32)), (Some(1), None));

    let t = model.tensor(1, TensorKind::ROUTER_WEIGHT).unwrap();
    assert_eq!((t.dtype, t.shape()), (Dtype::BF16, &[E as i64, H as i64][..]));
    let r = t.as_bf16().unwrap();
    assert_eq!(r.len(), E * H);
    assert_eq!(r[10], Bf16::from_f32(0.01 * 3.0 - 0.03 + 1.0));
    assert!(t.as_f32().is_none());

    // The loaded experts compute what the reference computes from the same weights.
    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, ..Default::default() }).unwrap();
    let x: Vec<Bf16> = (0..H).map(|i| Bf16::from_f32((i as f32 * 0.21).cos())).collect();
    let mut y = vec![Bf16::default(); H];
    s.decode(0, &x, &[1, 3], &[0.6, 0.4], &mut y).unwrap();
    let want = reference(&w[0], &x, &[1, 3], &[0.6, 0.4]);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(y.iter().zip(&want).all(|(g, w)| (g.to_f32() - w).abs() <= 0.02 * scale));
    drop(s);
    drop(model);

    // A progress closure that says stop cancels the load.
    let mut stop = |_: &str, _: u64, _: u64| false;
    let e = Model::load(&engine, &dir, LoadOptions::new().progress(&mut stop)).err().unwrap();
    assert_eq!(e.status(), Status::CANCELLED);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(feature = "cuda")]
#[test]
fn decode_cuda_on_a_cpu_session_is_refused() {
    let engine = engine();
    let model = build(&engine, &weights()).unwrap();
    let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, ..Default::default() }).unwrap();
    assert_eq!(s.device(), None);
    // SAFETY: a CPU session has no device path; the library refuses before reading the pointers.
    let e = unsafe {
        s.decode_cuda(0, 1, std::ptr::null(), std::ptr::null(), std::ptr::null(), std::ptr::null_mut(), std::ptr::null_mut())
    }
    .unwrap_err();
    assert!(e.status() == Status::UNSUPPORTED || e.status() == Status::INVALID_ARGUMENT, "{e}");
    assert!(!e.message().is_empty());
}
