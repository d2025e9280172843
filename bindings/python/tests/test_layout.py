"""The raw layer (freetoken._ffi) against the headers: every FT_API function declared with the same
parameter and result types, every struct with the same fields, size and offsets as the C compiler
lays it out, every integer FT_* constant with the header's value.

Environment: FT_INCLUDE_DIR (the headers; default ../../../include), CC (default cc), and the
library through FREETOKEN_LIBRARY as for the package."""
import ctypes
import importlib.util
import os
import shutil
import subprocess
import tempfile
import unittest

from freetoken import _ffi

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
INCLUDE = os.environ.get("FT_INCLUDE_DIR", os.path.join(ROOT, "include"))
HEADERS = ["freetoken.h", "freetoken_cuda.h", "freetoken_ep.h"]


def _parser():
    """tests/abi/check_rust_ffi.py's header parser (one parser of the headers for every binding check)."""
    path = os.environ.get("FT_HEADER_PARSER", os.path.join(ROOT, "tests", "abi", "check_rust_ffi.py"))
    spec = importlib.util.spec_from_file_location("check_rust_ffi", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PARSER = _parser()


def _parse_all():
    """The three headers parsed as one text (freetoken_cuda.h alone declares no struct, which the
    parser takes for a change of style)."""
    with tempfile.TemporaryDirectory() as tmp:
        joined = os.path.join(tmp, "all.h")
        with open(joined, "w") as out:
            for h in HEADERS:
                with open(os.path.join(INCLUDE, h)) as f:
                    out.write(f.read() + "\n")
        return PARSER.parse_header(joined)


PARSED = _parse_all()

SCALARS = {"int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int16_t": ctypes.c_int16,
           "uint16_t": ctypes.c_uint16, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
           "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "float": ctypes.c_float,
           "double": ctypes.c_double, "bool": ctypes.c_bool, "size_t": ctypes.c_size_t, "char": ctypes.c_char,
           "ft_status": ctypes.c_int32}
CALLBACKS = {"ft_log_fn": _ffi.ft_log_fn, "ft_progress_fn": _ffi.ft_progress_fn,
             "ft_ep_broadcast_fn": _ffi.ft_ep_broadcast_fn, "ft_ep_expert_fn": _ffi.ft_ep_expert_fn}
STRUCTS = {s.__name__: s for s in _ffi.STRUCTS}


def _all(kind):
    return PARSED[kind]


OPAQUE = PARSED["opaque"]


def accepted(t):
    """The ctypes types that may stand for C type tuple t (see check_rust_ffi.py's type tuples)."""
    if t[0] == "base":
        name = t[1]
        if name == "void":
            return {None}
        if name in CALLBACKS:
            return {CALLBACKS[name]}
        if name == "cudaStream_t":
            return {ctypes.c_void_p}
        return {SCALARS[name]}
    if t[0] == "ptr":
        inner = t[2]
        if inner == ("base", "char"):
            return {ctypes.c_char_p}
        if inner[0] == "base" and inner[1] in STRUCTS:
            return {ctypes.POINTER(STRUCTS[inner[1]])}
        if inner[0] == "ptr":  # ft_x **out, void **
            return {ctypes.POINTER(ctypes.c_void_p)}
        ok = {ctypes.c_void_p}
        if inner[0] == "base" and inner[1] in SCALARS:
            ok.add(ctypes.POINTER(SCALARS[inner[1]]))
        return ok
    raise AssertionError("unexpected C type %r" % (t,))


def field_type_ok(ctype, t):
    if t[0] == "array":
        return (issubclass(ctype, ctypes.Array) and ctype._length_ == t[1] and
                ctype._type_ in accepted(t[2]))
    if t[0] == "ptr" and t[2][0] == "base" and t[2][1] in SCALARS and t[2][1] != "char":
        return ctype in accepted(t) or ctype is ctypes.c_void_p
    return ctype in accepted(t)


class Layout(unittest.TestCase):
    def test_every_function_declared_with_header_types(self):
        funcs = _all("funcs")
        self.assertEqual(sorted(funcs), sorted(_ffi.FUNCTIONS), "functions in the headers vs freetoken._ffi")
        for name, (ret, params) in funcs.items():
            restype, argtypes = _ffi.FUNCTIONS[name]
            with self.subTest(function=name):
                self.assertIn(restype, accepted(ret), "%s: restype" % name)
                self.assertEqual(len(argtypes), len(params), "%s: parameter count" % name)
                for i, ((pname, ptype), at) in enumerate(zip(params, argtypes)):
                    if ptype[0] == "ptr" and ptype[2][0] == "base" and ptype[2][1] in OPAQUE:
                        self.assertIs(at, ctypes.c_void_p, "%s: handle parameter %s" % (name, pname))
                    else:
                        self.assertIn(at, accepted(ptype), "%s: parameter %d (%s)" % (name, i + 1, pname))

    def test_loaded_library_has_argtypes_and_restype_everywhere(self):
        lib = _ffi.load()
        for name, (restype, argtypes) in _ffi.FUNCTIONS.items():
            fn = getattr(lib, name)
            self.assertEqual(fn.restype, restype, name)
            self.assertEqual(list(fn.argtypes), list(argtypes), name)

    def test_every_struct_declared_once_with_header_fields(self):
        structs = _all("structs")
        self.assertEqual(sorted(structs), sorted(STRUCTS), "structs in the headers vs freetoken._ffi")
        self.assertEqual(len(_ffi.STRUCTS), len(STRUCTS), "a struct declared twice")
        for name, fields in structs.items():
            py = STRUCTS[name]._fields_
            with self.subTest(struct=name):
                self.assertEqual([f for f, _ in py], [f for f, _ in fields])
                for (fname, ctype), (_, t) in zip(py, fields):
                    self.assertTrue(field_type_ok(ctype, t), "%s.%s: %r for %r" % (name, fname, ctype, t))

    def test_sizes_and_offsets_match_the_compiler(self):
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler (set CC)")
        structs = _all("structs")
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "freetoken_ep.h"', "int main(void) {"]
        for s, fields in sorted(structs.items()):
            offs = " ".join('printf(" %%zu", offsetof(%s, %s));' % (s, f) for f, _ in fields)
            lines.append('printf("%s %%zu", sizeof(%s)); %s printf("\\n");' % (s, s, offs))
        lines.append("return 0; }")
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            subprocess.run([cc, "-std=c99", "-I", INCLUDE, src, "-o", exe], check=True)
            out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        seen = 0
        for line in out.splitlines():
            name, size, *offs = line.split()
            st = STRUCTS[name]
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(st), int(size), "sizeof(%s)" % name)
                self.assertEqual([getattr(st, f).offset for f, _ in st._fields_], [int(o) for o in offs],
                                 "offsets of %s" % name)
            seen += 1
        self.assertEqual(seen, len(structs))

    def test_constants_match_the_header(self):
        checked = 0
        defines = PARSED["defines"]
        for name in defines:
            value = PARSER.eval_define(defines, name)
            if value is None:
                continue
            with self.subTest(constant=name):
                self.assertTrue(hasattr(_ffi, name), "%s missing from freetoken._ffi" % name)
                self.assertEqual(getattr(_ffi, name), value, name)
            checked += 1
        self.assertGreater(checked, 60)
        # and nothing in _ffi that the headers do not define
        defined = set(defines)
        extra = [k for k in vars(_ffi) if k.startswith("FT_") and k not in defined]
        self.assertEqual(extra, [])


if __name__ == "__main__":
    unittest.main()
