//! The C API's enumerations as integer newtypes (values a newer library adds keep their number)
//! and the GPU choice.


use crate::sys;

macro_rules! int_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $value:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub i32);
        impl $name {
            $($(#[$vm])* pub const $variant: $name = $name($value);)*
            /// The C constant's name without its prefix, or None for a value this crate does not know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(v if v == $value => Some(stringify!($variant)),)*
                    _ => None,
                }
            }
        }
        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}::{}", stringify!($name), n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }
    };
}

int_enum!(
    /// Expert weight formats (`FT_FORMAT_*`).
    Format {
        BF16 = sys::FT_FORMAT_BF16,
        FP8_BLOCK = sys::FT_FORMAT_FP8_BLOCK,
        NVFP4 = sys::FT_FORMAT_NVFP4,
        MXFP4 = sys::FT_FORMAT_MXFP4,
        DS_FP4 = sys::FT_FORMAT_DS_FP4,
        Q4_0 = sys::FT_FORMAT_Q4_0,
        Q8_0 = sys::FT_FORMAT_Q8_0,
        Q2_K = sys::FT_FORMAT_Q2_K,
        Q3_K = sys::FT_FORMAT_Q3_K,
        Q4_K = sys::FT_FORMAT_Q4_K,
        Q5_K = sys::FT_FORMAT_Q5_K,
        Q6_K = sys::FT_FORMAT_Q6_K,
        IQ4_XS = sys::FT_FORMAT_IQ4_XS,
    }
);
int_enum!(
    /// Element types of model tensors (`FT_DTYPE_*`).
    Dtype { BF16 = sys::FT_DTYPE_BF16, F32 = sys::FT_DTYPE_F32 }
);
int_enum!(
    /// Expert activations (`FT_ACT_*`).
    Activation {
        SILU = sys::FT_ACT_SILU,
        GELU = sys::FT_ACT_GELU,
        GELU_TANH = sys::FT_ACT_GELU_TANH,
        SWIGLU_CLAMP = sys::FT_ACT_SWIGLU_CLAMP,
    }
);
int_enum!(
    /// Routing rules (`FT_ROUTING_*`).
    Routing {
        SOFTMAX_TOPK = sys::FT_ROUTING_SOFTMAX_TOPK,
        SOFTMAX_TOPK_RENORM = sys::FT_ROUTING_SOFTMAX_TOPK_RENORM,
        SIGMOID_GROUP_TOPK = sys::FT_ROUTING_SIGMOID_GROUP_TOPK,
        TOPK_SOFTMAX = sys::FT_ROUTING_TOPK_SOFTMAX,
        SQRTSOFTPLUS_GROUP_TOPK = sys::FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK,
    }
);
int_enum!(
    /// Backends (`FT_BACKEND_*`).
    Backend {
        AUTO = sys::FT_BACKEND_AUTO,
        CPU = sys::FT_BACKEND_CPU,
        GPU = sys::FT_BACKEND_GPU,
        OFFLOAD = sys::FT_BACKEND_OFFLOAD,
        HYBRID = sys::FT_BACKEND_HYBRID,
    }
);
int_enum!(
    /// Slot cache policies (`FT_CACHE_*`).
    CachePolicy {
        LRU = sys::FT_CACHE_LRU,
        FREQUENCY = sys::FT_CACHE_FREQUENCY,
        AUTO = sys::FT_CACHE_AUTO,
    }
);
int_enum!(
    /// Log levels (`FT_LOG_*`).
    LogLevel {
        OFF = sys::FT_LOG_OFF,
        ERROR = sys::FT_LOG_ERROR,
        WARN = sys::FT_LOG_WARN,
        INFO = sys::FT_LOG_INFO,
        DEBUG = sys::FT_LOG_DEBUG,
    }
);
int_enum!(
    /// The projection of an expert that [`ModelBuilder::set_expert`](crate::ModelBuilder::set_expert) writes (`FT_PROJ_*`).
    Projection {
        /// gate_proj / w1, [I, H] row-major.
        GATE = sys::FT_PROJ_GATE,
        /// up_proj / w3, [I, H] row-major.
        UP = sys::FT_PROJ_UP,
        /// down_proj / w2, [H, I] row-major.
        DOWN = sys::FT_PROJ_DOWN,
    }
);
int_enum!(
    /// Tensors a loaded model carries besides the routed experts (`FT_TENSOR_*`).
    TensorKind {
        ROUTER_WEIGHT = sys::FT_TENSOR_ROUTER_WEIGHT,
        ROUTER_BIAS = sys::FT_TENSOR_ROUTER_BIAS,
        SHARED_GATE = sys::FT_TENSOR_SHARED_GATE,
        SHARED_UP = sys::FT_TENSOR_SHARED_UP,
        SHARED_DOWN = sys::FT_TENSOR_SHARED_DOWN,
        SHARED_GATE_PROJ = sys::FT_TENSOR_SHARED_GATE_PROJ,
    }
);

/// Which GPU an engine or profile uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The first CUDA device if one is usable, else none (`FT_DEVICE_AUTO`).
    Auto,
    /// Never touch a GPU (`FT_DEVICE_NONE`).
    CpuOnly,
    /// This CUDA device ordinal.
    Cuda(i32),
}

impl Device {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Device::Auto => sys::FT_DEVICE_AUTO,
            Device::CpuOnly => sys::FT_DEVICE_NONE,
            Device::Cuda(n) => n,
        }
    }
    pub(crate) fn from_raw(v: i32) -> Device {
        match v {
            sys::FT_DEVICE_AUTO => Device::Auto,
            sys::FT_DEVICE_NONE => Device::CpuOnly,
            n => Device::Cuda(n),
        }
    }
}
