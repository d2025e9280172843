"""Raw layer: the C API of libfreetoken one-to-one through ctypes.

Every struct of include/freetoken.h, freetoken_cuda.h and freetoken_ep.h is declared once here,
with every FT_* integer constant and the argument and result types of every function.
tests/test_layout.py checks all of it against the headers with the C compiler.
"""
import ctypes
import ctypes.util
import os
import shutil
import subprocess
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float, c_int32,
                    c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

# ---- constants (values fixed forever by the headers) -------------------------------------------

FT_VERSION_MAJOR = 0
FT_VERSION_MINOR = 8
FT_VERSION_PATCH = 0
FT_VERSION_NUMBER = FT_VERSION_MAJOR * 10000 + FT_VERSION_MINOR * 100 + FT_VERSION_PATCH

FT_OK = 0
FT_ERR_INVALID_ARGUMENT = 1
FT_ERR_OUT_OF_MEMORY = 2
FT_ERR_IO = 3
FT_ERR_FORMAT = 4
FT_ERR_UNSUPPORTED = 5
FT_ERR_NO_DEVICE = 6
FT_ERR_DEVICE = 7
FT_ERR_DEVICE_LOST = 8
FT_ERR_TIMEOUT = 9
FT_ERR_CANCELLED = 10
FT_ERR_NON_FINITE = 11
FT_ERR_STATE = 12
FT_ERR_INTERNAL = 13

FT_FORMAT_BF16 = 1
FT_FORMAT_FP8_BLOCK = 2
FT_FORMAT_NVFP4 = 3
FT_FORMAT_MXFP4 = 4
FT_FORMAT_DS_FP4 = 5
FT_FORMAT_Q4_0 = 6
FT_FORMAT_Q8_0 = 7
FT_FORMAT_Q2_K = 8
FT_FORMAT_Q3_K = 9
FT_FORMAT_Q4_K = 10
FT_FORMAT_Q5_K = 11
FT_FORMAT_Q6_K = 12
FT_FORMAT_IQ4_XS = 13

FT_DTYPE_BF16 = 1
FT_DTYPE_F32 = 2

FT_ACT_SILU = 0
FT_ACT_GELU = 1
FT_ACT_GELU_TANH = 2
FT_ACT_SWIGLU_CLAMP = 3

FT_ROUTING_SOFTMAX_TOPK = 1
FT_ROUTING_SOFTMAX_TOPK_RENORM = 2
FT_ROUTING_SIGMOID_GROUP_TOPK = 3
FT_ROUTING_TOPK_SOFTMAX = 4
FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK = 5
FT_ROUTING_TOPK_SIGMOID = 6
FT_ROUTING_SOFTMAX_GROUP_TOPK = 7
FT_ROUTING_SOFTMAX_BIASED_TOPK = 8
FT_ROUTING_SPARSEMIXER = 9

FT_ROUTE_WEIGHT_OUTPUT = 0
FT_ROUTE_WEIGHT_INPUT = 1

FT_BACKEND_AUTO = 0
FT_BACKEND_CPU = 1
FT_BACKEND_GPU = 2
FT_BACKEND_OFFLOAD = 3
FT_BACKEND_HYBRID = 4
FT_CACHE_LRU = 0
FT_CACHE_FREQUENCY = 1
FT_CACHE_AUTO = 2

FT_LOG_OFF = 0
FT_LOG_ERROR = 1
FT_LOG_WARN = 2
FT_LOG_INFO = 3
FT_LOG_DEBUG = 4

FT_DEVICE_AUTO = -2
FT_DEVICE_NONE = -1

FT_PROJ_GATE = 1
FT_PROJ_UP = 2
FT_PROJ_DOWN = 3

FT_TENSOR_ROUTER_WEIGHT = 1
FT_TENSOR_ROUTER_BIAS = 2
FT_TENSOR_SHARED_GATE = 3
FT_TENSOR_SHARED_UP = 4
FT_TENSOR_SHARED_DOWN = 5
FT_TENSOR_SHARED_GATE_PROJ = 6
FT_TENSOR_EXPERT_GATE_UP_BIAS = 7
FT_TENSOR_EXPERT_DOWN_BIAS = 8

FT_EP_MODE_THROUGHPUT = 0
FT_EP_MODE_LATENCY = 1
FT_EP_WIRE_BF16 = 0
FT_EP_WIRE_FP8 = 1
FT_EP_WIRE_FP8_UE8M0 = 2

# ---- callback types ----------------------------------------------------------------------------

ft_log_fn = CFUNCTYPE(None, c_void_p, c_int32, c_char_p)
ft_progress_fn = CFUNCTYPE(c_bool, c_void_p, c_char_p, c_uint64, c_uint64)
ft_ep_broadcast_fn = CFUNCTYPE(c_int32, c_void_p, c_size_t, c_void_p)

# ---- structs -----------------------------------------------------------------------------------


class ft_build_info(Structure):
    _fields_ = [("struct_size", c_uint32), ("version_number", c_uint32), ("cuda", c_bool), ("nccl", c_bool),
                ("reserved_", c_uint8 * 2), ("cuda_runtime_version", c_int32), ("cuda_archs", c_char_p),
                ("onednn_version", c_char_p), ("cpu_isa", c_char_p), ("compiler", c_char_p),
                ("onednn_bf16", c_bool)]


class ft_engine_params(Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("cpu_threads", c_int32),
                ("pin_threads", c_bool), ("reserved_", c_uint8 * 3)]


class ft_engine_info(Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("cpu_threads", c_int32),
                ("physical_cores", c_int32), ("cpu_isa", c_char_p), ("device_name", c_char_p)]


class ft_model_load_params(Structure):
    _fields_ = [("struct_size", c_uint32), ("io_threads", c_int32), ("progress", ft_progress_fn),
                ("progress_user_data", c_void_p)]


class ft_model_desc(Structure):
    _fields_ = [("struct_size", c_uint32), ("num_layers", c_int32), ("num_experts", c_int32),
                ("top_k", c_int32), ("hidden_size", c_int32), ("intermediate_size", c_int32),
                ("format", c_int32), ("activation", c_int32), ("swiglu_alpha", c_float),
                ("swiglu_limit", c_float), ("routing", c_int32), ("num_groups", c_int32),
                ("topk_groups", c_int32), ("routed_scaling_factor", c_float), ("renormalize", c_bool),
                ("reserved_", c_uint8 * 3), ("route_weight", c_int32), ("router_jitter_eps", c_float)]


class ft_model_info(Structure):
    _fields_ = [("struct_size", c_uint32), ("num_layers", c_int32), ("num_experts", c_int32),
                ("top_k", c_int32), ("hidden_size", c_int32), ("intermediate_size", c_int32),
                ("format", c_int32), ("activation", c_int32), ("routing", c_int32), ("num_groups", c_int32),
                ("topk_groups", c_int32), ("routed_scaling_factor", c_float), ("swiglu_alpha", c_float),
                ("swiglu_limit", c_float), ("first_moe_layer", c_int32), ("total_layers", c_int32),
                ("shared_intermediate_size", c_int32), ("expert_bytes", c_uint64), ("bank_bytes", c_uint64),
                ("architecture", c_char_p), ("pinned_bytes", c_uint64), ("route_weight", c_int32),
                ("router_jitter_eps", c_float), ("expert_biases", c_int32), ("shared_expert_gate", c_int32),
                ("formats_used", c_uint32), ("mixed_formats", c_int32),
                ("hash_layers", c_int32), ("vocab_size", c_int32)]


class ft_tensor_view(Structure):
    _fields_ = [("struct_size", c_uint32), ("dtype", c_int32), ("ndim", c_int32), ("shape", c_int64 * 4),
                ("data", c_void_p), ("nbytes", c_size_t)]


class ft_session_params(Structure):
    _fields_ = [("struct_size", c_uint32), ("backend", c_int32), ("max_tokens", c_int32),
                ("shared_experts", c_bool), ("check_finite", c_bool), ("reserved_", c_uint8 * 2),
                ("cache_slots", c_int64), ("cache_fraction", c_double), ("vram_reserve_bytes", c_uint64),
                ("prefill_min_tokens", c_int32), ("hybrid_fraction", c_float), ("hybrid_adaptive", c_bool),
                ("reserved2_", c_uint8 * 3), ("handoff_timeout_seconds", c_double),
                ("cache_policy", c_int32), ("cache_half_life", c_int32)]


class ft_session_stats(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved_", c_uint32), ("decode_calls", c_uint64),
                ("tokens", c_uint64), ("routes_cpu", c_uint64), ("routes_skipped", c_uint64),
                ("experts_cpu", c_uint64), ("cpu_bytes", c_uint64), ("cpu_seconds", c_double),
                ("routes_gpu", c_uint64), ("cache_hits", c_uint64), ("cache_misses", c_uint64),
                ("fetched_experts", c_uint64), ("fetched_bytes", c_uint64), ("prefill_calls", c_uint64),
                ("prefill_bytes", c_uint64), ("hybrid_fraction", c_double), ("hybrid_gpu_seconds", c_double),
                ("hybrid_timed_steps", c_uint64)]


class ft_layer_stats(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved_", c_uint32), ("calls", c_uint64),
                ("active_experts", c_uint64), ("misses", c_uint64), ("fetched_experts", c_uint64),
                ("fetched_bytes", c_uint64)]


class ft_profile_params(Structure):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("cpu_threads", c_int32), ("formats", c_uint32),
                ("max_seconds", c_double), ("progress", ft_progress_fn), ("progress_user_data", c_void_p)]


class ft_profile_machine(Structure):
    _fields_ = [("struct_size", c_uint32), ("physical_cores", c_int32), ("threads_used", c_int32),
                ("reserved_", c_uint32), ("cpu_read_gbs", c_double), ("h2d_gbs", c_double), ("d2h_gbs", c_double),
                ("gpu_name", c_char_p), ("cpu_model", c_char_p)]


class ft_profile_format(Structure):
    _fields_ = [("struct_size", c_uint32), ("format", c_int32), ("expert_bytes", c_uint64), ("cpu_gbs", c_double),
                ("gather_gbs", c_double), ("cpu_overlap_gbs", c_double), ("gather_overlap_gbs", c_double),
                ("fetch_fraction", c_double), ("cpu_kernel", c_char_p)]


class ft_ep_params(Structure):
    _fields_ = [("struct_size", c_uint32), ("num_experts", c_int32), ("slots_per_rank", c_int32),
                ("top_k", c_int32), ("hidden", c_int64), ("max_tokens", c_int64), ("mode", c_int32),
                ("wire", c_int32), ("chunks", c_int32), ("nccl_max_ctas", c_int32), ("link_bytes_per_s", c_double),
                ("max_expert_rows", c_int64), ("combine_wire", c_int32), ("combine_max_rel_error", c_float)]


class ft_ep_group_info(Structure):
    _fields_ = [("struct_size", c_uint32), ("rank", c_int32), ("ranks", c_int32), ("slots_per_rank", c_int32),
                ("device", c_int32), ("nccl_version", c_int32), ("last_chunks", c_int32),
                ("last_bytes_sent", c_uint64), ("pci_bus_id", c_char * 16), ("numa_node", c_int32),
                ("pcie_link_width", c_int32), ("pcie_link_gts", c_double), ("link_bytes_per_s", c_double),
                ("calibrated_bytes_per_s", c_double), ("p2p_known", c_uint64), ("p2p_mask", c_uint64),
                ("combine_wire", c_int32), ("combine_last_rel_error", c_float)]


class ft_ep_expert_batch(Structure):
    _fields_ = [("struct_size", c_uint32), ("slots", c_int32), ("hidden", c_int64), ("max_rows", c_int64),
                ("offset", c_void_p), ("x", c_void_p), ("y", c_void_p), ("row_source", c_void_p),
                ("row_token", c_void_p), ("row_weight", c_void_p)]


ft_ep_expert_fn = CFUNCTYPE(None, POINTER(ft_ep_expert_batch), c_void_p, c_void_p)

STRUCTS = [ft_build_info, ft_engine_params, ft_engine_info, ft_model_load_params, ft_model_desc, ft_model_info,
           ft_tensor_view, ft_session_params, ft_session_stats, ft_layer_stats, ft_profile_params,
           ft_profile_machine, ft_profile_format, ft_ep_params, ft_ep_group_info, ft_ep_expert_batch]

# ---- functions: name -> (restype, argtypes) ----------------------------------------------------
# Handles (ft_engine *, ...) and data pointers are c_void_p; ft_x ** out-parameters POINTER(c_void_p).

_H = c_void_p
_OUT = POINTER(c_void_p)
_ERR = [c_char_p, c_size_t]

FUNCTIONS = {
    # freetoken.h
    "ft_version_number": (c_uint32, []),
    "ft_version_string": (c_char_p, []),
    "ft_status_string": (c_char_p, [c_int32]),
    "ft_build_info_get": (c_int32, [POINTER(ft_build_info)]),
    "ft_log_set_callback": (None, [ft_log_fn, c_void_p, c_int32]),
    "ft_engine_params_init": (None, [POINTER(ft_engine_params)]),
    "ft_engine_create": (c_int32, [POINTER(ft_engine_params), _OUT] + _ERR),
    "ft_engine_free": (None, [_H]),
    "ft_engine_last_error": (c_char_p, [_H]),
    "ft_engine_get_info": (c_int32, [_H, POINTER(ft_engine_info)]),
    "ft_model_load_params_init": (None, [POINTER(ft_model_load_params)]),
    "ft_model_load": (c_int32, [_H, c_char_p, POINTER(ft_model_load_params), _OUT] + _ERR),
    "ft_model_desc_init": (None, [POINTER(ft_model_desc)]),
    "ft_model_create": (c_int32, [_H, POINTER(ft_model_desc), _OUT] + _ERR),
    "ft_model_set_expert": (c_int32, [_H, c_int32, c_int32, c_int32, c_void_p, c_size_t]),
    "ft_model_set_router_bias": (c_int32, [_H, c_int32, c_void_p, c_int32]),
    "ft_model_finalize": (c_int32, [_H]),
    "ft_model_free": (None, [_H]),
    "ft_model_last_error": (c_char_p, [_H]),
    "ft_model_get_info": (c_int32, [_H, POINTER(ft_model_info)]),
    "ft_model_moe_layer": (c_int32, [_H, c_int32]),
    "ft_model_layer_formats": (c_int32, [_H, c_int32, POINTER(c_int32), POINTER(c_int32)]),
    "ft_model_tensor": (c_int32, [_H, c_int32, c_int32, POINTER(ft_tensor_view)]),
    "ft_session_params_init": (None, [POINTER(ft_session_params)]),
    "ft_session_create": (c_int32, [_H, POINTER(ft_session_params), _OUT] + _ERR),
    "ft_session_free": (None, [_H]),
    "ft_session_last_error": (c_char_p, [_H]),
    "ft_session_backend": (c_int32, [_H]),
    "ft_session_cache_policy": (c_int32, [_H]),
    "ft_route": (c_int32, [_H, c_int32, c_int32, c_void_p, c_void_p, c_void_p]),
    "ft_route_tokens": (c_int32, [_H, c_int32, c_int32, c_void_p, c_void_p, c_void_p, c_void_p]),
    "ft_decode": (c_int32, [_H, c_int32, c_int32, c_void_p, c_void_p, c_void_p, c_void_p]),
    "ft_session_get_stats": (c_int32, [_H, POINTER(ft_session_stats)]),
    "ft_session_reset_stats": (None, [_H]),
    "ft_session_get_layer_stats": (c_int32, [_H, c_int32, POINTER(ft_layer_stats)]),
    "ft_session_status": (c_int32, [_H]),
    "ft_session_backend_reason": (c_char_p, [_H]),
    "ft_profile_params_init": (None, [POINTER(ft_profile_params)]),
    "ft_profile_bandwidth": (c_int32, [POINTER(ft_profile_params), _OUT] + _ERR),
    "ft_profile_load": (c_int32, [c_char_p, _OUT] + _ERR),
    "ft_profile_save": (c_int32, [_H, c_char_p] + _ERR),
    "ft_profile_free": (None, [_H]),
    "ft_profile_get_machine": (c_int32, [_H, POINTER(ft_profile_machine)]),
    "ft_profile_get_format": (c_int32, [_H, c_int32, POINTER(ft_profile_format)]),
    # freetoken_cuda.h (cudaStream_t as c_void_p)
    "ft_decode_cuda": (c_int32, [_H, c_int32, c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "ft_session_device": (c_int32, [_H]),
    # freetoken_ep.h
    "ft_ep_params_init": (None, [POINTER(ft_ep_params)]),
    "ft_ep_group_create_from_comm": (c_int32, [c_void_p, c_int32, POINTER(ft_ep_params), _OUT] + _ERR),
    "ft_ep_group_bootstrap": (c_int32, [c_int32, c_int32, c_int32, ft_ep_broadcast_fn, c_void_p,
                                        POINTER(ft_ep_params), _OUT] + _ERR),
    "ft_ep_group_bootstrap_local": (c_int32, [c_int32, c_void_p, POINTER(ft_ep_params), _OUT] + _ERR),
    "ft_ep_group_info_get": (c_int32, [_H, POINTER(ft_ep_group_info)]),
    "ft_ep_group_set_placement": (c_int32, [_H, c_void_p, c_size_t]),
    "ft_ep_group_get_placement": (c_int32, [_H, c_void_p, c_size_t, POINTER(c_size_t)]),
    "ft_ep_dispatch": (c_int32, [_H, c_void_p, c_void_p, c_void_p, c_int64, c_void_p,
                                 POINTER(ft_ep_expert_batch)]),
    "ft_ep_combine": (c_int32, [_H, c_void_p, c_void_p]),
    "ft_ep_forward": (c_int32, [_H, c_void_p, c_void_p, c_void_p, c_int64, ft_ep_expert_fn, c_void_p, c_void_p,
                                c_void_p]),
    "ft_ep_group_last_error": (c_char_p, [_H]),
    "ft_ep_group_free": (None, [_H]),
    "ft_ep_forward_session": (c_int32, [_H, _H, _H, c_int32, c_int32, c_void_p, c_void_p, c_void_p, c_int64,
                                        c_void_p, c_void_p]),
}

# ---- finding and loading the library -----------------------------------------------------------

_lib = None
_lib_path = None
_lib_source = None


def _candidates():
    """(path or name, how it was found) in lookup order."""
    env = os.environ.get("FREETOKEN_LIBRARY")
    if env:
        yield env, "FREETOKEN_LIBRARY"
        return
    pkg_config = shutil.which("pkg-config")
    if pkg_config:
        try:
            libdir = subprocess.run([pkg_config, "--variable=libdir", "freetoken"], capture_output=True,
                                    text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            libdir = ""
        if libdir:
            for name in ("libfreetoken.so.%d" % FT_VERSION_MAJOR, "libfreetoken.so", "libfreetoken.dylib"):
                path = os.path.join(libdir, name)
                if os.path.exists(path):
                    yield path, "pkg-config"
                    break
    yield "libfreetoken.so.%d" % FT_VERSION_MAJOR, "system loader"
    found = ctypes.util.find_library("freetoken")
    if found:
        yield found, "system loader"


def _declare(lib):
    missing = []
    for name, (restype, argtypes) in FUNCTIONS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return missing


def load():
    """The loaded library (ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path, _lib_source
    if _lib is not None:
        return _lib
    tried = []
    for path, source in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, source, e))
            continue
        missing = _declare(lib)
        if missing:
            raise ImportError("%s does not export %s: not a libfreetoken of this version" % (path, ", ".join(missing)))
        _lib, _lib_path, _lib_source = lib, path, source
        return lib
    raise ImportError("libfreetoken not found; set FREETOKEN_LIBRARY to the library's path, or install it where "
                      "pkg-config or the system loader finds it. Tried:\n  " + "\n  ".join(tried))


def library_path():
    """(path, source): the library file loaded and how it was found ('FREETOKEN_LIBRARY', 'pkg-config',
    'system loader'). For the system loader the path is the resolved file when /proc tells it."""
    load()
    path = _lib_path
    if _lib_source == "system loader":
        path = _resolved_path(path)
    return path, _lib_source


def _resolved_path(name):
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libfreetoken"):
                    return parts[5]
    except OSError:
        pass
    return name
