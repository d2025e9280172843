"""Checks and raw pointers of the arrays handed to the library.

Accepted: torch tensors (CPU or CUDA, data_ptr()), numpy arrays, any object with
__cuda_array_interface__, __array_interface__ or __dlpack__, and writable host buffers (memoryview of
an array.array or ctypes array, cast to the shape: memoryview(a).cast("B").cast("H", (T, H))). Element types are named by the C API's
element: "bf16" (torch.bfloat16, numpy uint16 bit patterns, or int16 bit patterns), "i32", "f32".
"""
import ctypes
import sys

# (itemsize, numpy/array-interface kinds accepted, torch dtype names accepted)
_KINDS = {
    "bf16": (2, ("<u2", "<i2", "|u2", "|i2"), ("bfloat16",)),
    "i32": (4, ("<i4",), ("int32",)),
    "f32": (4, ("<f4",), ("float32",)),
}


class ArrayError(ValueError):
    """An argument array has the wrong dtype, shape, layout or device."""


class Buffer:
    """A checked array: address, shape, device ('cpu' or ('cuda', index)), and the object kept alive."""
    __slots__ = ("ptr", "shape", "device", "owner")

    def __init__(self, ptr, shape, device, owner):
        self.ptr, self.shape, self.device, self.owner = ptr, tuple(shape), device, owner

    @property
    def is_cuda(self):
        return self.device != "cpu"


def _torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _from_torch(obj, kind, name, writable):
    dtype = str(obj.dtype).replace("torch.", "")
    if dtype not in _KINDS[kind][2] and not (kind == "bf16" and dtype == "int16"):
        raise ArrayError("%s: dtype torch.%s, expected %s" % (name, dtype, _describe(kind)))
    if not obj.is_contiguous():
        raise ArrayError("%s: not contiguous (call .contiguous())" % name)
    if writable and obj.requires_grad and obj.is_leaf:
        raise ArrayError("%s: an output may not require grad" % name)
    dev = obj.device
    if dev.type == "cpu":
        device = "cpu"
    elif dev.type == "cuda":
        device = ("cuda", dev.index if dev.index is not None else 0)
    else:
        raise ArrayError("%s: device %s; FreeToken takes CPU or CUDA tensors" % (name, dev))
    return Buffer(obj.data_ptr(), obj.shape, device, obj)


def _from_interface(obj, iface, kind, name, writable, device):
    typestr = iface["typestr"]
    if typestr not in _KINDS[kind][1]:
        raise ArrayError("%s: element type %r, expected %s" % (name, typestr, _describe(kind)))
    shape = tuple(iface["shape"])
    strides = iface.get("strides")
    if strides is not None:
        expect, step = [], _KINDS[kind][0]
        for n in reversed(shape):
            expect.append(step)
            step *= n
        if tuple(reversed(expect)) != tuple(strides) and any(n > 1 for n in shape):
            raise ArrayError("%s: not C-contiguous" % name)
    ptr, readonly = iface["data"]
    if writable and readonly:
        raise ArrayError("%s: read-only array given as an output" % name)
    return Buffer(ptr, shape, device, obj)


_FORMATS = {"bf16": ("H", "h"), "i32": ("i", "l"), "f32": ("f",)}


def _is_buffer(obj):
    try:
        memoryview(obj)
        return True
    except TypeError:
        return False


def _from_memoryview(obj, kind, name):
    mv = memoryview(obj)
    fmt = mv.format.lstrip("<=@")
    if fmt not in _FORMATS[kind] or mv.itemsize != _KINDS[kind][0]:
        raise ArrayError("%s: buffer format %r, expected %s" % (name, mv.format, _describe(kind)))
    if not mv.c_contiguous:
        raise ArrayError("%s: not C-contiguous" % name)
    if mv.readonly:
        raise ArrayError("%s: read-only buffers are not accepted (use a bytearray, array.array or numpy)" % name)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if mv.nbytes else 0
    return Buffer(ptr, mv.shape, "cpu", mv)


def _describe(kind):
    return {"bf16": "bf16 (torch.bfloat16 or numpy uint16 bit patterns)", "i32": "int32",
            "f32": "float32"}[kind]


def as_buffer(obj, kind, name, shape=None, writable=False):
    """Checks `obj` and returns its Buffer. `shape` entries of None match any size."""
    if obj is None:
        raise ArrayError("%s: None given, expected an array" % name)
    if _torch_tensor(obj):
        buf = _from_torch(obj, kind, name, writable)
    elif hasattr(obj, "__cuda_array_interface__"):
        iface = obj.__cuda_array_interface__
        dev = 0
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            dev = torch.cuda.current_device()
        buf = _from_interface(obj, iface, kind, name, writable, ("cuda", dev))
    elif hasattr(obj, "__array_interface__"):
        buf = _from_interface(obj, obj.__array_interface__, kind, name, writable, "cpu")
    elif hasattr(obj, "__dlpack__"):
        return as_buffer(_from_dlpack(obj, name), kind, name, shape, writable)
    elif _is_buffer(obj):
        buf = _from_memoryview(obj, kind, name)
    else:
        raise ArrayError("%s: %s is not an array (torch tensor, numpy array, __array_interface__, "
                         "__cuda_array_interface__ or DLPack)" % (name, type(obj).__name__))
    if shape is not None:
        ok = len(buf.shape) == len(shape) and all(w is None or w == g for w, g in zip(shape, buf.shape))
        if not ok:
            want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
            raise ArrayError("%s: shape %s, expected %s" % (name, list(buf.shape), want))
    return buf


def _from_dlpack(obj, name):
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "from_dlpack"):
        return torch.from_dlpack(obj)
    try:
        import numpy
        return numpy.from_dlpack(obj)
    except (ImportError, AttributeError, TypeError, RuntimeError, BufferError) as e:
        raise ArrayError("%s: a DLPack object needs torch or numpy >= 1.22 to be read (%s)" % (name, e))


def same_device(name_bufs):
    """Raises unless every buffer is on one device; returns that device."""
    devices = {b.device for _, b in name_bufs}
    if len(devices) > 1:
        raise ArrayError("arrays on different devices: " +
                         ", ".join("%s on %s" % (n, _dev_name(b.device)) for n, b in name_bufs))
    return devices.pop()


def _dev_name(device):
    return "cpu" if device == "cpu" else "cuda:%d" % device[1]
