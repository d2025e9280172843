"""freetoken: Python bindings of libfreetoken (ctypes, no compiler needed).

    import freetoken as ft
    with ft.Engine() as engine, ft.Model.load(engine, "/models/Qwen3-30B-A3B") as model, \\
            ft.Session(model, backend="cpu") as session:
        ids, weights = session.route(layer, logits)
        out = session.decode(layer, hidden_bf16, ids, weights)

The library is found through $FREETOKEN_LIBRARY, then `pkg-config --variable=libdir freetoken`, then
the system loader; library_path() says which. freetoken._ffi is the raw one-to-one layer (structs,
constants, argtypes/restypes of every function); freetoken.torch plugs FreeToken into transformers
models.
"""
from . import _ffi
from ._arrays import ArrayError
from ._core import (BACKEND_NAMES, Engine, Error, Model, Profile, Session, TensorView, build_info, set_log_callback,
                    status_string, version, version_number)
from ._ep import EpGroup, ep_params
from ._ffi import library_path
from ._ffi import load as load_library

# Every FT_* constant of the headers, at package level.
globals().update({k: v for k, v in vars(_ffi).items() if k.startswith("FT_")})

__version__ = "0.8.0"
__all__ = ["ArrayError", "BACKEND_NAMES", "Engine", "EpGroup", "Error", "Model", "Profile", "Session", "TensorView",
           "build_info", "ep_params", "library_path", "load_library", "set_log_callback", "status_string", "version",
           "version_number"] + [k for k in vars(_ffi) if k.startswith("FT_")]
