"""Safe layer: handles as context managers, errors as freetoken.Error, arrays checked."""
import contextlib
import ctypes
import os
import threading
import weakref

from . import _ffi
from ._arrays import ArrayError, as_buffer, same_device
from ._ffi import load

_ERR_SIZE = 1024


class Error(Exception):
    """A failed FreeToken call: status (int), status_name ('FT_ERR_FORMAT'), message (the library's text)."""

    def __init__(self, status, message="", call=""):
        self.status = int(status)
        self.status_name = status_string(status)
        self.message = message
        self.call = call
        text = "%s: %s" % (call, self.status_name) if call else self.status_name
        super().__init__(text + (": " + message if message else ""))


def status_string(status):
    return load().ft_status_string(int(status)).decode()


def version():
    """The loaded library's version string ("0.8.0")."""
    return load().ft_version_string().decode()


def version_number():
    return int(load().ft_version_number())


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _struct_dict(st):
    out = {}
    for name, _ in st._fields_:
        if name.startswith("reserved") or name == "struct_size":
            continue
        v = getattr(st, name)
        if isinstance(v, bytes):
            v = _s(v)
        elif isinstance(v, ctypes.Array):
            v = list(v)
        out[name] = v
    return out


def build_info():
    """ft_build_info_get as a dict (cuda, nccl, cuda_archs, onednn_version, cpu_isa, compiler, ...)."""
    return _read_struct(_ffi.ft_build_info, "ft_build_info_get", ())


def _check(status, call, handle_error=None, err_buffer=None):
    if status != _ffi.FT_OK:
        msg = ""
        if err_buffer is not None:
            msg = _s(err_buffer.value)
        elif handle_error is not None:
            msg = handle_error()
        raise Error(status, msg, call)


def _sized(ctype):
    """An output struct of `ctype` whose struct_size holds its size."""
    st = ctype()
    st.struct_size = ctypes.sizeof(st)
    return st


def _read_struct(ctype, call, args, check=_check):
    """The output struct that the C function `call`(*args, &struct) fills, as a dict."""
    st = _sized(ctype)
    check(getattr(load(), call)(*args, ctypes.byref(st)), call)
    return _struct_dict(st)


# ---- logging ------------------------------------------------------------------------------------

_log_lock = threading.Lock()
_log_callback = None  # the ctypes thunk the library holds; kept alive here
_LEVEL_NAMES = {"off": 0, "error": 1, "warn": 2, "warning": 2, "info": 3, "debug": 4}


def set_log_callback(fn, level=_ffi.FT_LOG_WARN):
    """Routes library messages of `level` or more severe to fn(level: int, message: str); None restores
    standard error. fn may be called from any library thread; exceptions it raises are printed and dropped
    (they cannot cross the C library). level: FT_LOG_* or 'off'/'error'/'warn'/'info'/'debug'."""
    global _log_callback
    if isinstance(level, str):
        if level.lower() not in _LEVEL_NAMES:
            raise ValueError("log level %r: expected one of %s" % (level, ", ".join(_LEVEL_NAMES)))
        level = _LEVEL_NAMES[level.lower()]
    if fn is not None and not callable(fn):
        raise TypeError("set_log_callback: fn must be callable or None")
    with _log_lock:
        if fn is None:
            thunk = _ffi.ft_log_fn()
        else:
            def call(_user, lvl, message):
                try:
                    fn(int(lvl), _s(message))
                except BaseException:  # noqa: B902 - nothing may unwind into C
                    import traceback
                    traceback.print_exc()
            thunk = _ffi.ft_log_fn(call)
        load().ft_log_set_callback(thunk, None, int(level))
        _log_callback = thunk  # the previous thunk is no longer referenced by the library


class _Progress:
    """A Python progress callable as ft_progress_fn; fn(phase, done, total) -> bool|None (False cancels).
    An exception cancels the operation and is re-raised by the caller after the C call returns."""

    def __init__(self, fn):
        self.fn, self.error = fn, None

        def call(_user, phase, done, total):
            try:
                return self.fn(_s(phase), int(done), int(total)) is not False
            except BaseException as e:  # noqa: B902
                self.error = e
                return False
        self.thunk = _ffi.ft_progress_fn(call) if fn is not None else _ffi.ft_progress_fn()

    def reraise(self):
        if self.error is not None:
            raise self.error


# ---- handles ------------------------------------------------------------------------------------

class _Handle:
    """An owned C handle. close() frees it (and first the handles made from it); so does leaving a
    `with` block or garbage collection. Calls on a closed handle raise Error(FT_ERR_STATE).

    Calls hold the handle in use (_use) for their duration: close() from another thread waits for
    them, so the library never runs on a freed handle. On an exclusive handle (the C API's
    one-thread-at-a-time session and EP group) calls from different threads also wait for each
    other."""
    _free_name = None
    _error_name = None
    _exclusive = False

    def __init__(self, ptr, parent=None):
        self._ptr = ptr
        self._parent = parent  # kept alive: the C API requires parents to outlive children
        self._children = weakref.WeakSet()
        self._cond = threading.Condition()
        self._users = {}  # thread id -> calls of that thread in progress
        if parent is not None:
            parent._children.add(self)

    @property
    def handle(self):
        """The raw pointer (int) for calls through freetoken._ffi."""
        if not self._ptr:
            raise Error(_ffi.FT_ERR_STATE, "%s is closed" % type(self).__name__)
        return self._ptr

    @property
    def closed(self):
        return not self._ptr

    @contextlib.contextmanager
    def _use(self):
        """The raw pointer, kept open until the block ends."""
        me = threading.get_ident()
        with self._cond:
            while self._exclusive and any(t != me for t in self._users):
                self._cond.wait()
            ptr = self.handle
            self._users[me] = self._users.get(me, 0) + 1
        try:
            yield ptr
        finally:
            with self._cond:
                self._users[me] -= 1
                if not self._users[me]:
                    del self._users[me]
                self._cond.notify_all()

    def close(self):
        me = threading.get_ident()
        while True:
            for child in list(self._children):
                child.close()
            with self._cond:
                if me in self._users:
                    raise Error(_ffi.FT_ERR_STATE, "%s.close() inside a call on it" % type(self).__name__)
                while self._users:
                    self._cond.wait()
                if any(not c.closed for c in self._children):
                    continue  # made by a call that has just finished: closed first
                ptr, self._ptr = self._ptr, None
            if ptr:
                getattr(load(), self._free_name)(ptr)
            return

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._ptr:
                self.close()
        except Exception:
            pass

    def last_error(self):
        return _s(getattr(load(), self._error_name)(self._ptr)) if self._ptr else ""

    def _check(self, status, call):
        _check(status, call, handle_error=self.last_error)

    def _call(self, call, *args):
        """The C function `call`(handle, *args) with the handle in use; its status raised as Error with
        the handle's text."""
        with self._use() as h:
            self._check(getattr(load(), call)(h, *args), call)

    def _value(self, call, *args):
        """What the C function `call`(handle, *args) returns, with the handle in use."""
        with self._use() as h:
            return getattr(load(), call)(h, *args)

    def _read(self, ctype, call, *args):
        """The output struct that `call`(handle, *args, &struct) fills, as a dict."""
        with self._use() as h:
            return _read_struct(ctype, call, (h,) + args, self._check)


def _backend_value(backend):
    names = {"auto": 0, "cpu": 1, "gpu": 2, "offload": 3, "hybrid": 4}
    if isinstance(backend, str):
        if backend.lower() not in names:
            raise ValueError("backend %r: expected one of %s" % (backend, ", ".join(names)))
        return names[backend.lower()]
    return int(backend)


BACKEND_NAMES = {0: "auto", 1: "cpu", 2: "gpu", 3: "offload", 4: "hybrid"}
CACHE_POLICY_NAMES = {0: "lru", 1: "frequency", 2: "auto"}


def _cache_policy_value(policy):
    if isinstance(policy, str):
        names = {v: k for k, v in CACHE_POLICY_NAMES.items()}
        if policy.lower() not in names:
            raise ValueError("cache_policy %r: expected one of %s" % (policy, ", ".join(names)))
        return names[policy.lower()]
    return int(policy)


def _set_fields(st, kwargs, what):
    known = {n for n, _ in st._fields_ if not n.startswith("reserved") and n != "struct_size"}
    for k, v in kwargs.items():
        if k not in known:
            raise TypeError("%s: unknown field %r (fields: %s)" % (what, k, ", ".join(sorted(known))))
        setattr(st, k, v)


class Engine(_Handle):
    """ft_engine: the CPU worker pool and the GPU choice. Engine(device=FT_DEVICE_AUTO, cpu_threads=0,
    pin_threads=True)."""
    _free_name, _error_name = "ft_engine_free", "ft_engine_last_error"

    def __init__(self, device=_ffi.FT_DEVICE_AUTO, cpu_threads=0, pin_threads=True, **fields):
        lib = load()
        p = _ffi.ft_engine_params()
        lib.ft_engine_params_init(ctypes.byref(p))
        _set_fields(p, dict(device=device, cpu_threads=cpu_threads, pin_threads=pin_threads, **fields),
                    "Engine")
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        _check(lib.ft_engine_create(ctypes.byref(p), ctypes.byref(out), err, len(err)), "ft_engine_create",
               err_buffer=err)
        super().__init__(out.value)

    def info(self):
        return self._read(_ffi.ft_engine_info, "ft_engine_get_info")


class TensorView:
    """A tensor the model owns (ft_model_tensor): dtype FT_DTYPE_*, shape, data address, nbytes.
    numpy() / torch() return copies."""

    def __init__(self, model, view):
        self.model = model
        self.dtype = view.dtype
        self.shape = tuple(view.shape[i] for i in range(view.ndim))
        self.data = view.data
        self.nbytes = view.nbytes

    def _bytes(self):
        with self.model._use():  # raises once the model is closed
            return ctypes.string_at(self.data, self.nbytes)

    def numpy(self):
        import numpy as np
        dt = np.uint16 if self.dtype == _ffi.FT_DTYPE_BF16 else np.float32
        return np.frombuffer(self._bytes(), dtype=dt).reshape(self.shape).copy()

    def torch(self):
        import torch
        raw = bytearray(self._bytes())
        if self.dtype == _ffi.FT_DTYPE_BF16:
            return torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).reshape(self.shape).clone()
        return torch.frombuffer(raw, dtype=torch.float32).reshape(self.shape).clone()


class Model(_Handle):
    """ft_model: the routed experts in host banks. Model.load(engine, path) or Model.create(engine, ...),
    then set_expert(...) for every projection and finalize()."""
    _free_name, _error_name = "ft_model_free", "ft_model_last_error"

    @classmethod
    def load(cls, engine, path, io_threads=0, progress=None):
        """Loads a Hugging Face checkpoint directory or GGUF file. progress(phase, done, total) -> bool."""
        lib = load()
        p = _ffi.ft_model_load_params()
        lib.ft_model_load_params_init(ctypes.byref(p))
        p.io_threads = io_threads
        cb = _Progress(progress)
        p.progress = cb.thunk
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        with engine._use() as e:
            status = lib.ft_model_load(e, os.fsencode(os.fspath(path)), ctypes.byref(p), ctypes.byref(out), err,
                                       len(err))
            cb.reraise()
            _check(status, "ft_model_load", err_buffer=err)
            return cls(out.value, engine)  # a child of the engine before the engine can be closed

    @classmethod
    def create(cls, engine, num_layers, num_experts, top_k, hidden_size, intermediate_size, **fields):
        """An empty bf16 model (ft_model_create); other ft_model_desc fields as keywords."""
        lib = load()
        d = _ffi.ft_model_desc()
        lib.ft_model_desc_init(ctypes.byref(d))
        _set_fields(d, dict(num_layers=num_layers, num_experts=num_experts, top_k=top_k, hidden_size=hidden_size,
                            intermediate_size=intermediate_size, **fields), "Model.create")
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        with engine._use() as e:
            _check(lib.ft_model_create(e, ctypes.byref(d), ctypes.byref(out), err, len(err)), "ft_model_create",
                   err_buffer=err)
            m = cls(out.value, engine)
        m._desc = (d.intermediate_size, d.hidden_size, d.num_experts)
        return m

    def set_expert(self, layer, expert, proj, weights):
        """proj FT_PROJ_GATE/UP ([I, H] bf16) or FT_PROJ_DOWN ([H, I] bf16), host memory."""
        I, H, _ = getattr(self, "_desc", (None, None, None))
        shape = (I, H) if proj in (_ffi.FT_PROJ_GATE, _ffi.FT_PROJ_UP) else (H, I)
        buf = as_buffer(weights, "bf16", "weights", shape)
        if buf.is_cuda:
            raise ArrayError("weights: must be in host memory")
        nbytes = 2
        for n in buf.shape:
            nbytes *= n
        self._call("ft_model_set_expert", layer, expert, proj, buf.ptr, nbytes)

    def set_router_bias(self, layer, bias):
        buf = as_buffer(bias, "f32", "bias", (None,))
        if buf.is_cuda:
            raise ArrayError("bias: must be in host memory")
        self._call("ft_model_set_router_bias", layer, buf.ptr, buf.shape[0])

    def finalize(self):
        self._call("ft_model_finalize")

    def info(self):
        return self._read(_ffi.ft_model_info, "ft_model_get_info")

    def layer_formats(self, layer):
        """(gate_up, down) FT_FORMAT_* values of MoE layer `layer`; they differ from info()["format"]
        only in models that mix formats (info()["mixed_formats"])."""
        gu, dn = ctypes.c_int32(), ctypes.c_int32()
        self._call("ft_model_layer_formats", layer, ctypes.byref(gu), ctypes.byref(dn))
        return gu.value, dn.value

    def moe_layer(self, model_layer):
        """MoE layer index of checkpoint layer `model_layer`, or -1."""
        return int(self._value("ft_model_moe_layer", model_layer))

    def tensor(self, layer, which):
        v = _sized(_ffi.ft_tensor_view)
        self._call("ft_model_tensor", layer, which, ctypes.byref(v))
        return TensorView(self, v)


def _cuda_stream_handle(stream, device):
    """A cudaStream_t (int) from None (torch's current stream of `device`, else 0), an int, or a
    torch.cuda.Stream."""
    if stream is None:
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_stream(device[1]).cuda_stream
        return 0
    if hasattr(stream, "cuda_stream"):
        return stream.cuda_stream
    return int(stream)


class Session(_Handle):
    """ft_session: one model on one engine. Session(model, backend='auto', max_tokens=256, ...);
    other ft_session_params fields as keywords (cache_fraction, shared_experts, hybrid_fraction,
    cache_policy: 'lru', 'frequency' or 'auto' (default) or the FT_CACHE_* value, ...)."""
    _free_name, _error_name = "ft_session_free", "ft_session_last_error"
    _exclusive = True

    def __init__(self, model, backend="auto", max_tokens=256, **fields):
        lib = load()
        p = _ffi.ft_session_params()
        lib.ft_session_params_init(ctypes.byref(p))
        if "cache_policy" in fields:
            fields["cache_policy"] = _cache_policy_value(fields["cache_policy"])
        _set_fields(p, dict(backend=_backend_value(backend), max_tokens=max_tokens, **fields), "Session")
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        with model._use() as m:
            _check(lib.ft_session_create(m, ctypes.byref(p), ctypes.byref(out), err, len(err)), "ft_session_create",
                   err_buffer=err)
            super().__init__(out.value, model)  # a child of the model before the model can be closed
        self.model = model
        self.max_tokens = p.max_tokens
        info = model.info()
        self.num_layers, self.num_experts = info["num_layers"], info["num_experts"]
        self.top_k, self.hidden_size = info["top_k"], info["hidden_size"]

    @property
    def backend(self):
        """The backend the session runs, by name ('cpu', 'gpu', 'offload', 'hybrid')."""
        return BACKEND_NAMES.get(int(self._value("ft_session_backend")), "unknown")

    @property
    def cache_policy(self):
        """The slot cache policy the session runs ('lru' or 'frequency'; 'auto' resolved), or None
        for a backend without a slot cache (cpu, gpu)."""
        return CACHE_POLICY_NAMES.get(int(self._value("ft_session_cache_policy")))

    @property
    def backend_reason(self):
        with self._use() as h:  # the text is valid until the next call on the session
            return _s(load().ft_session_backend_reason(h))

    @property
    def device(self):
        """CUDA device ordinal of the engine, or FT_DEVICE_NONE."""
        return int(self._value("ft_session_device"))

    def status(self):
        """FT_OK, or the sticky status of a session that cannot continue."""
        return int(self._value("ft_session_status"))

    def _check_layer(self, layer):
        if not 0 <= layer < self.num_layers:
            raise Error(_ffi.FT_ERR_INVALID_ARGUMENT, "layer %d out of range [0, %d)" % (layer, self.num_layers))

    def route(self, layer, logits, expert_ids=None, expert_weights=None, token_ids=None):
        """Router logits [T, E] float32 (host) -> (expert_ids [T, K] int32, expert_weights [T, K] float32),
        by the model's routing rule. Outputs are allocated like `logits` (numpy or torch) unless given.
        token_ids [T] int32 (host): the tokens' ids, required on the layers that route by token id
        (model.info()["hash_layers"]: DeepSeek-V4), through ft_route_tokens."""
        E, K = self.num_experts, self.top_k
        lg = as_buffer(logits, "f32", "logits", (None, E))
        if lg.is_cuda:
            raise ArrayError("logits: ft_route reads host memory; pass CPU logits")
        T = lg.shape[0]
        if expert_ids is None:
            expert_ids, expert_weights = _alloc_like(logits, (T, K), "i32"), _alloc_like(logits, (T, K), "f32")
        ids = as_buffer(expert_ids, "i32", "expert_ids", (T, K), writable=True)
        w = as_buffer(expert_weights, "f32", "expert_weights", (T, K), writable=True)
        same_device([("logits", lg), ("expert_ids", ids), ("expert_weights", w)])
        self._check_layer(layer)
        if not 1 <= T <= 1 << 30:
            raise Error(_ffi.FT_ERR_INVALID_ARGUMENT, "%d tokens: must be 1..%d" % (T, 1 << 30))
        if token_ids is None:
            self._call("ft_route", layer, T, lg.ptr, ids.ptr, w.ptr)
        else:
            tok = as_buffer(token_ids, "i32", "token_ids", (T,))
            if tok.is_cuda:
                raise ArrayError("token_ids: ft_route_tokens reads host memory; pass CPU token ids")
            self._call("ft_route_tokens", layer, T, lg.ptr, tok.ptr, ids.ptr, w.ptr)
        return expert_ids, expert_weights

    def decode(self, layer, hidden, expert_ids, expert_weights, out=None, stream=None):
        """One MoE layer: hidden [T, H] bf16, expert_ids [T, K] int32, expert_weights [T, K] float32 ->
        out [T, H] bf16 (allocated like `hidden` unless given). Host arrays go through ft_decode; CUDA
        arrays through ft_decode_cuda on `stream` (default: torch's current stream), which returns before
        the result is ready. Calls longer than max_tokens are split."""
        H, K = self.hidden_size, self.top_k
        x = as_buffer(hidden, "bf16", "hidden", (None, H))
        T = x.shape[0]
        ids = as_buffer(expert_ids, "i32", "expert_ids", (T, K))
        w = as_buffer(expert_weights, "f32", "expert_weights", (T, K))
        if out is None:
            out = _alloc_like(hidden, (T, H), "bf16")
        y = as_buffer(out, "bf16", "out", (T, H), writable=True)
        device = same_device([("hidden", x), ("expert_ids", ids), ("expert_weights", w), ("out", y)])
        if T == 0:
            return out
        if x.ptr == y.ptr:
            raise ArrayError("out may not alias hidden")
        self._check_layer(layer)
        extra = ()
        if device != "cpu":
            if device[1] != self.device:
                raise ArrayError("arrays on cuda:%d but the session's engine uses %s" % (
                    device[1], "no GPU" if self.device < 0 else "cuda:%d" % self.device))
            extra = (_cuda_stream_handle(stream, device),)
        call = "ft_decode" if device == "cpu" else "ft_decode_cuda"
        step = self.max_tokens
        for t0 in range(0, T, step):
            n = min(step, T - t0)
            self._call(call, layer, n, x.ptr + t0 * H * 2, ids.ptr + t0 * K * 4, w.ptr + t0 * K * 4,
                       y.ptr + t0 * H * 2, *extra)
        return out

    def stats(self):
        return self._read(_ffi.ft_session_stats, "ft_session_get_stats")

    def layer_stats(self, layer):
        return self._read(_ffi.ft_layer_stats, "ft_session_get_layer_stats", layer)

    def reset_stats(self):
        self._value("ft_session_reset_stats")


def _alloc_like(ref, shape, kind):
    """A new array of `shape` and element `kind`, numpy or torch and on the device of `ref`."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ref, torch.Tensor):
        dt = {"bf16": torch.bfloat16, "i32": torch.int32, "f32": torch.float32}[kind]
        return torch.empty(shape, dtype=dt, device=ref.device)
    if hasattr(ref, "__cuda_array_interface__"):
        raise ArrayError("pass the output array explicitly for %s inputs" % type(ref).__name__)
    if isinstance(ref, memoryview):
        import array
        code = {"bf16": "H", "i32": "i", "f32": "f"}[kind]
        n = 1
        for d in shape:
            n *= d
        return memoryview(array.array(code, bytes(n * 4 if kind != "bf16" else n * 2))).cast("B").cast(code, shape)
    import numpy as np
    dt = {"bf16": np.uint16, "i32": np.int32, "f32": np.float32}[kind]
    return np.empty(shape, dtype=dt)


class Profile(_Handle):
    """ft_profile: measured bandwidths. Profile.measure(...) runs ft_profile_bandwidth; Profile.load(path)."""
    _free_name = "ft_profile_free"

    def last_error(self):
        return ""

    @classmethod
    def measure(cls, device=_ffi.FT_DEVICE_AUTO, cpu_threads=0, formats=0, max_seconds=30.0, progress=None):
        lib = load()
        p = _ffi.ft_profile_params()
        lib.ft_profile_params_init(ctypes.byref(p))
        p.device, p.cpu_threads, p.formats, p.max_seconds = device, cpu_threads, formats, max_seconds
        cb = _Progress(progress)
        p.progress = cb.thunk
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        status = lib.ft_profile_bandwidth(ctypes.byref(p), ctypes.byref(out), err, len(err))
        cb.reraise()
        _check(status, "ft_profile_bandwidth", err_buffer=err)
        return cls(out.value)

    @classmethod
    def load(cls, path=None):
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        p = None if path is None else os.fsencode(os.fspath(path))
        _check(load().ft_profile_load(p, ctypes.byref(out), err, len(err)), "ft_profile_load", err_buffer=err)
        return cls(out.value)

    def save(self, path=None):
        err = ctypes.create_string_buffer(_ERR_SIZE)
        p = None if path is None else os.fsencode(os.fspath(path))
        with self._use() as h:
            _check(load().ft_profile_save(h, p, err, len(err)), "ft_profile_save", err_buffer=err)

    def machine(self):
        return self._read(_ffi.ft_profile_machine, "ft_profile_get_machine")

    def format(self, fmt):
        return self._read(_ffi.ft_profile_format, "ft_profile_get_format", int(fmt))
