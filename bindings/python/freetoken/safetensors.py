"""A small reader and writer of the safetensors format (8-byte little-endian header length, a JSON
header of {name: {dtype, shape, data_offsets}}, then the raw little-endian data), enough to write
checkpoints FreeToken loads and to read the non-expert weights of one. numpy or torch arrays."""
import json
import os
import struct
import sys

_NP = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "F64": "<f8", "I8": "|i1", "U8": "|u1", "I16": "<i2",
       "I32": "<i4", "I64": "<i8", "BOOL": "|b1", "F8_E4M3": "|u1", "F8_E8M0": "|u1"}
_TORCH = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "uint8": "U8",
          "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL"}
_NP_TO_ST = {"uint16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "uint8": "U8",
             "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL"}


def _raw(value, dtype):
    """(safetensors dtype, shape, bytes) of a torch tensor or numpy array (numpy uint16 = bf16 bits)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        st = dtype or _TORCH[str(t.dtype).replace("torch.", "")]
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return st, list(t.shape), t.numpy().tobytes()
    import numpy as np
    a = np.ascontiguousarray(value)
    st = dtype or _NP_TO_ST[a.dtype.name]
    return st, list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def save_file(tensors, path, metadata=None, dtypes=None):
    """Writes {name: tensor} to `path`. dtypes may name a safetensors dtype per tensor (e.g. 'F8_E4M3'
    for uint8 bytes)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        st, shape, data = _raw(tensors[name], (dtypes or {}).get(name))
        header[name] = {"dtype": st, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_header(path):
    """({name: {dtype, shape, data_offsets}}, data start offset) of one file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("%s: not a safetensors file (shorter than 8 bytes)" % path)
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise ValueError("%s: header of %d bytes is implausible" % (path, n))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def checkpoint_files(directory):
    """The safetensors files of a checkpoint directory (sharded through model.safetensors.index.json)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(directory, n) for n in names]
    files = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError("%s: no .safetensors files" % directory)
    return [os.path.join(directory, n) for n in files]


def load_torch(path, names=None, device="cpu"):
    """{name: torch tensor} of the file's tensors (those in `names` if given), read one at a time."""
    import torch
    header, start = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, meta in header.items():
            if names is not None and name not in names:
                continue
            a, b = meta["data_offsets"]
            f.seek(start + a)
            buf = bytearray(f.read(b - a))
            dt = meta["dtype"]
            tdt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                   "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32,
                   "I64": torch.int64, "BOOL": torch.bool, "F8_E4M3": torch.uint8, "F8_E8M0": torch.uint8}[dt]
            if dt == "BF16":
                t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else torch.empty(0, dtype=tdt)
            else:
                t = torch.frombuffer(buf, dtype=tdt) if buf else torch.empty(0, dtype=tdt)
            out[name] = t.reshape(meta["shape"]).to(device)
    return out
