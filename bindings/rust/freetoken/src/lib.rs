//! Safe Rust API of libfreetoken, which computes the routed experts of Mixture-of-Experts layers
//! whose weights live in host memory.
//!
//! The handles follow the C API (`freetoken.h`) and its threading contract:
//!
//! | type | C handle | frees | lives at most as long as | `Send` | `Sync` |
//! |---|---|---|---|---|---|
//! | [`Engine`] | `ft_engine` | `ft_engine_free` | | yes | yes (shared by many threads) |
//! | [`ModelBuilder<'e>`] | `ft_model` before finalize | `ft_model_free` | its engine | no | no (built by one thread) |
//! | [`Model<'e>`] | `ft_model`, immutable | `ft_model_free` | its engine | yes | yes (immutable) |
//! | [`Session<'m>`] | `ft_session` | `ft_session_free` | its model | yes | no (one thread at a time) |
//! | [`Profile`] | `ft_profile` | `ft_profile_free` | | yes | yes (immutable) |
//! | [`ep::EpGroup`] | `ft_ep_group` | `ft_ep_group_free` | | yes | no (one thread at a time) |
//!
//! Every fallible call returns [`Result<T>`](Result) whose [`Error`] carries the library's
//! [`Status`] and its message. Slices are checked against the shapes the library will read or
//! write before any call, so a wrong length is an `Error` with [`Status::INVALID_ARGUMENT`],
//! never an out-of-bounds access. bf16 values are [`Bf16`] (the 16-bit pattern).
//!
//! ```
//! use freetoken::{Bf16, Engine, EngineParams, ModelBuilder, ModelDesc, Projection, Session, SessionParams, Backend};
//!
//! let engine = Engine::new(&EngineParams { cpu_threads: 2, ..EngineParams::default() })?;
//! let desc = ModelDesc { num_layers: 1, num_experts: 4, top_k: 2, hidden_size: 64, intermediate_size: 32,
//!                        ..ModelDesc::default() };
//! let mut builder = ModelBuilder::new(&engine, &desc)?;
//! let w = vec![Bf16::from_f32(0.01); 64 * 32];
//! for e in 0..4 {
//!     for p in [Projection::GATE, Projection::UP, Projection::DOWN] {
//!         builder.set_expert(0, e, p, &w)?;
//!     }
//! }
//! let model = builder.finalize()?;
//! let mut session = Session::new(&model, &SessionParams { backend: Backend::CPU, ..SessionParams::default() })?;
//! let logits = [0.5f32, 0.1, 0.9, -1.0];              // one token, 4 experts
//! let (mut ids, mut weights) = ([0i32; 2], [0f32; 2]);
//! session.route(0, &logits, &mut ids, &mut weights)?;
//! assert_eq!(ids, [2, 0]);
//! let x = vec![Bf16::from_f32(1.0); 64];
//! let mut y = vec![Bf16::default(); 64];
//! session.decode(0, &x, &ids, &weights, &mut y)?;
//! assert!(y.iter().all(|v| v.to_f32().is_finite()));
//! # Ok::<(), freetoken::Error>(())
//! ```
//!
//! The compiler holds the contract. A session cannot outlive its model:
//! ```compile_fail
//! # use freetoken::*;
//! # let engine = Engine::new(&EngineParams::default()).unwrap();
//! let session = {
//!     let model = ModelBuilder::new(&engine, &ModelDesc::default()).unwrap().finalize().unwrap();
//!     Session::new(&model, &SessionParams::default()).unwrap()
//! };
//! ```
//! nor be used by two threads at once (it is not `Sync`):
//! ```compile_fail
//! # use freetoken::*;
//! fn shared<T: Sync>(_: &T) {}
//! # fn f(s: Session<'_>) {
//! shared(&s);
//! # }
//! ```
//! and a model under construction stays on its thread (not `Send`):
//! ```compile_fail
//! # use freetoken::*;
//! fn movable<T: Send>(_: T) {}
//! # fn f(b: ModelBuilder<'_>) {
//! movable(b);
//! # }
//! ```
//!
//! Building needs the library through `pkg-config` (or `FREETOKEN_LIB_DIR`); see freetoken-sys.
//! The oldest Rust this crate builds with is 1.63.


pub use freetoken_sys as sys;

// The int_enum! macro is defined in enums, so it comes first (ep uses the macro too).
#[macro_use]
mod enums;
mod bf16;
mod engine;
mod error;
mod library;
mod model;
mod profile;
mod progress;
mod session;
mod util;

pub mod ep;

pub use bf16::Bf16;
pub use engine::{Engine, EngineInfo, EngineParams};
pub use enums::{Activation, Backend, CachePolicy, Device, Dtype, Format, LogLevel, Projection, Routing, TensorKind};
pub use error::{Error, Result, Status};
pub use library::{build_info, reset_log_callback, set_log_callback, version, version_string, BuildInfo};
pub use model::{LoadOptions, Model, ModelBuilder, ModelDesc, ModelInfo, TensorView};
pub use profile::{Profile, ProfileFormat, ProfileMachine, ProfileOptions};
pub use progress::ProgressFn;
pub use session::{LayerStats, Session, SessionParams, SessionStats};
