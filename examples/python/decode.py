#!/usr/bin/env python3
"""A Python consumer of libfreetoken through ctypes: builds a small MoE layer from memory, routes
random router logits and decodes a batch. Run with the library on the loader path, e.g.
  LD_LIBRARY_PATH=build/lib/api python3 examples/python/decode.py
or pass the library's path as the first argument."""
import ctypes
import random
import struct
import sys

lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libfreetoken.so.0")

FT_OK, FT_PROJ_GATE, FT_PROJ_DOWN = 0, 1, 3


class ModelDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_layers", ctypes.c_int32),
                ("num_experts", ctypes.c_int32), ("top_k", ctypes.c_int32),
                ("hidden_size", ctypes.c_int32), ("intermediate_size", ctypes.c_int32),
                ("format", ctypes.c_int32), ("activation", ctypes.c_int32),
                ("swiglu_alpha", ctypes.c_float), ("swiglu_limit", ctypes.c_float),
                ("routing", ctypes.c_int32), ("num_groups", ctypes.c_int32),
                ("topk_groups", ctypes.c_int32), ("routed_scaling_factor", ctypes.c_float),
                ("renormalize", ctypes.c_bool), ("reserved_", ctypes.c_uint8 * 3)]


class SessionStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved_", ctypes.c_uint32),
                ("decode_calls", ctypes.c_uint64), ("tokens", ctypes.c_uint64),
                ("routes_cpu", ctypes.c_uint64), ("routes_skipped", ctypes.c_uint64),
                ("experts_cpu", ctypes.c_uint64), ("cpu_bytes", ctypes.c_uint64),
                ("cpu_seconds", ctypes.c_double)]


lib.ft_status_string.restype = ctypes.c_char_p
lib.ft_version_string.restype = ctypes.c_char_p
lib.ft_session_last_error.restype = ctypes.c_char_p
lib.ft_model_last_error.restype = ctypes.c_char_p


def check(status, what):
    if status != FT_OK:
        raise RuntimeError(f"{what}: {lib.ft_status_string(status).decode()}")


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def from_bf16(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


print("libfreetoken", lib.ft_version_string().decode())
err = ctypes.create_string_buffer(256)
engine, model, session = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
check(lib.ft_engine_create(None, ctypes.byref(engine), err, len(err)), err.value.decode())

desc = ModelDesc()
lib.ft_model_desc_init(ctypes.byref(desc))
desc.num_layers, desc.num_experts, desc.top_k = 1, 8, 2
desc.hidden_size, desc.intermediate_size = 64, 32
check(lib.ft_model_create(engine, ctypes.byref(desc), ctypes.byref(model), err, len(err)), err.value.decode())
rng = random.Random(7)
n = 64 * 32
for e in range(8):
    for proj in range(FT_PROJ_GATE, FT_PROJ_DOWN + 1):
        w = (ctypes.c_uint16 * n)(*[bf16(rng.uniform(-0.2, 0.2)) for _ in range(n)])
        check(lib.ft_model_set_expert(model, 0, e, proj, w, ctypes.sizeof(w)), lib.ft_model_last_error(model).decode())
check(lib.ft_model_finalize(model), lib.ft_model_last_error(model).decode())
check(lib.ft_session_create(model, None, ctypes.byref(session), err, len(err)), err.value.decode())

T, E, K, H = 3, 8, 2, 64
logits = (ctypes.c_float * (T * E))(*[rng.gauss(0, 1) for _ in range(T * E)])
ids, weights = (ctypes.c_int32 * (T * K))(), (ctypes.c_float * (T * K))()
x = (ctypes.c_uint16 * (T * H))(*[bf16(rng.uniform(-1, 1)) for _ in range(T * H)])
y = (ctypes.c_uint16 * (T * H))()
check(lib.ft_route(session, 0, T, logits, ids, weights), lib.ft_session_last_error(session).decode())
check(lib.ft_decode(session, 0, T, x, ids, weights, y), lib.ft_session_last_error(session).decode())
out = [from_bf16(v) for v in y]
assert all(v == v for v in out) and any(v != 0.0 for v in out), "bad output"
assert abs(sum(weights[0:K]) - 1.0) < 1e-5, "routing weights must be renormalised"

stats = SessionStats()
stats.struct_size = ctypes.sizeof(stats)
check(lib.ft_session_get_stats(session, ctypes.byref(stats)), "stats")
print(f"token 0 -> experts {list(ids[0:K])}, {stats.routes_cpu} routes, {stats.cpu_bytes / 1e6:.2f} MB read")

# Bad input comes back as a status, not a crash.
bad = (ctypes.c_int32 * (T * K))(*([E] * (T * K)))
status = lib.ft_decode(session, 0, T, x, bad, weights, y)
assert lib.ft_status_string(status) == b"FT_ERR_INVALID_ARGUMENT", status
print("error text:", lib.ft_session_last_error(session).decode())

lib.ft_session_free(session)
lib.ft_model_free(model)
lib.ft_engine_free(engine)
