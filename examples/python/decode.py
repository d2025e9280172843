#!/usr/bin/env python3
"""A Python consumer of libfreetoken through the freetoken package (bindings/python): builds a small
MoE layer from memory, routes random router logits and decodes a batch. Standard library only (numpy
and torch arrays work the same way). Run with the library's path as the first argument, or with the
package installed and the library where FREETOKEN_LIBRARY, pkg-config or the system loader finds it:
  python3 examples/python/decode.py build/lib/engine/api/libfreetoken.so.0"""
import array
import os
import random
import struct
import sys

if len(sys.argv) > 1:
    os.environ["FREETOKEN_LIBRARY"] = sys.argv[1]
try:
    import freetoken as ft
except ImportError:  # run from a source tree without the package installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
    import freetoken as ft


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def from_bf16(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def matrix(typecode, rows, cols, values=None):
    """A rows x cols host array ('H' bf16 bits, 'i' int32, 'f' float32) as a 2-D memoryview."""
    a = array.array(typecode, values if values is not None else [0] * (rows * cols))
    return memoryview(a).cast("B").cast(typecode, (rows, cols))


path, source = ft.library_path()
print("libfreetoken", ft.version(), "from", path, "(%s)" % source)
T, E, K, H, I = 3, 8, 2, 64, 32
rng = random.Random(7)
with ft.Engine(device=ft.FT_DEVICE_NONE) as engine:
    model = ft.Model.create(engine, num_layers=1, num_experts=E, top_k=K, hidden_size=H, intermediate_size=I)
    for e in range(E):
        for proj, shape in ((ft.FT_PROJ_GATE, (I, H)), (ft.FT_PROJ_UP, (I, H)), (ft.FT_PROJ_DOWN, (H, I))):
            w = matrix("H", *shape, [bf16(rng.uniform(-0.2, 0.2)) for _ in range(H * I)])
            model.set_expert(0, e, proj, w)
    model.finalize()
    session = ft.Session(model, backend="cpu")

    logits = matrix("f", T, E, [rng.gauss(0, 1) for _ in range(T * E)])
    x = matrix("H", T, H, [bf16(rng.uniform(-1, 1)) for _ in range(T * H)])
    ids, weights = session.route(0, logits)
    y = session.decode(0, x, ids, weights)
    out = [from_bf16(v) for v in y.cast("B").cast("H")]
    assert all(v == v for v in out) and any(v != 0.0 for v in out), "bad output"
    assert abs(sum(weights[0, k] for k in range(K)) - 1.0) < 1e-5, "routing weights must be renormalised"

    stats = session.stats()
    print(f"token 0 -> experts {[ids[0, k] for k in range(K)]}, {stats['routes_cpu']} routes, "
          f"{stats['cpu_bytes'] / 1e6:.2f} MB read")

    # Bad input comes back as freetoken.Error carrying the status and the session's message.
    bad = matrix("i", T, K, [E] * (T * K))
    try:
        session.decode(0, x, bad, weights)
        raise AssertionError("an expert id >= E was accepted")
    except ft.Error as e:
        assert e.status == ft.FT_ERR_INVALID_ARGUMENT and e.status_name == "FT_ERR_INVALID_ARGUMENT", e
        print("error text:", e.message)
# leaving the with block freed the session, the model and the engine
assert session.closed and model.closed
