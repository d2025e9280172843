#!/usr/bin/env python3
"""Checks Rust FFI declarations against the C headers (include/freetoken*.h).

Usage: check_rust_ffi.py [--cc CC] [--complete] RUST_FILE HEADER...

For everything RUST_FILE declares:
  - functions in `extern "C"` blocks: some header declares an FT_API function of that name with
    the same number of parameters, and each parameter type and the return type correspond
    (int32_t <-> i32, const T * <-> *const T, char <-> c_char, size_t <-> usize, ...);
  - `#[repr(C)]` structs: a header defines a struct of that name with the same field names in
    the same order and corresponding types; the offset of every field and the size of the
    struct agree (x86-64/AArch64 LP64 rules, computed for both sides). Opaque Rust structs (only
    zero-sized `_` fields) must be opaque handles in a header;
  - callback types (`Option<unsafe extern "C" fn(..) -> R>`): the header's function pointer
    typedef of that name has corresponding parameter and return types;
  - type aliases and integer constants: same name and value as the header's typedef / #define;
    `cudaStream_t` (from CUDA's headers) must be `*mut c_void`.
With --complete, every function, struct, opaque handle, callback typedef, type alias and integer
#define of the headers must also be declared in RUST_FILE (the -sys crate's promise).
With --cc, the layout computed from the headers is also compared with the C compiler's sizeof
and offsetof, so the layout model itself is checked. Exits 1 on any mismatch. Standard library
only.
"""
import os
import re
import subprocess
import sys
import tempfile

# C scalar types and their Rust spellings; (size, alignment) on LP64.
SCALARS = {
    "int8_t": ("i8", 1), "uint8_t": ("u8", 1), "int16_t": ("i16", 2), "uint16_t": ("u16", 2),
    "int32_t": ("i32", 4), "uint32_t": ("u32", 4), "int64_t": ("i64", 8), "uint64_t": ("u64", 8),
    "float": ("f32", 4), "double": ("f64", 8), "bool": ("bool", 1), "size_t": ("usize", 8),
    "char": ("c_char", 1), "void": ("c_void", None),
}
RUST_SIZES = {rust: size for rust, size in SCALARS.values()}
RUST_SIZES.update({"c_int": 4, "c_uint": 4, "c_float": 4, "c_double": 8, "isize": 8, "i128": 16})
RUST_ALIASES = {"c_int": "i32", "c_uint": "u32", "c_float": "f32", "c_double": "f64", "c_uchar": "u8",
                "c_schar": "i8", "size_t": "usize"}
POINTER = 8


def strip_c_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


# ------------------------------------------------------------------------------------------
# Types are tuples: ("base", name) | ("ptr", pointee_is_const, inner) | ("array", n, inner)
#                   | ("fnptr", name)  (function pointer typedefs, by name; their signatures are
#                                      compared on their own, see check_callbacks)
#                   | ("fnsig", ret, [(name, type)])  (a Rust Option<unsafe extern "C" fn(..)>)
# ------------------------------------------------------------------------------------------

def c_type(decl_tokens):
    """Tokens of a C declaration without its name, e.g. ['const', 'ft_model', '*']."""
    const, base, t = False, None, None
    for tok in decl_tokens:
        if tok == "const":
            const = True
        elif tok == "*":
            t = ("ptr", const, t if t is not None else ("base", base))
            const = False
        elif tok in ("struct", "unsigned", "signed"):
            raise ValueError(f"unexpected '{tok}' in a public declaration")
        else:
            if base is not None:
                raise ValueError(f"cannot parse C type {' '.join(decl_tokens)!r}")
            base = tok
    return t if t is not None else ("base", base)


def c_decl(text):
    """'const ft_model *model' -> (name, type); arrays 'uint8_t reserved_[3]' too."""
    text = text.strip()
    arr = re.fullmatch(r"(.*?)(\w+)\s*\[\s*(\d+)\s*\]", text, re.S)
    dims = None
    if arr:
        text, dims = arr.group(1) + arr.group(2), int(arr.group(3))
    toks = re.findall(r"\w+|\*", text)
    name = toks[-1]
    t = c_type(toks[:-1])
    if dims is not None:
        t = ("array", dims, t)
    return name, t


def parse_header(path):
    raw = open(path, encoding="utf-8").read()
    text = strip_c_comments(raw)
    defines = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(FT_\w+)[ \t]+([^\n]+)$", text, re.M):
        defines[m.group(1)] = m.group(2).strip()
    body = re.sub(r"^[ \t]*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)  # drop preprocessor lines
    body = re.sub(r'extern\s+"C"\s*\{|^\}[ \t]*$', " ", body, flags=re.M)

    aliases, opaque, fnptrs, structs, funcs = {}, set(), {}, {}, {}
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", body, re.S):
        if m.group(1) != m.group(3):
            raise ValueError(f"struct tag {m.group(1)} differs from typedef {m.group(3)}")
        fields = []
        for stmt in m.group(2).split(";"):
            stmt = " ".join(stmt.split())
            if not stmt:
                continue
            first, *more = [p.strip() for p in stmt.split(",")]
            name, t = c_decl(first)
            fields.append((name, t))
            base_tokens = re.findall(r"\w+", first)[:-1]  # 'float swiglu_alpha, swiglu_limit'
            for extra in more:
                fields.append(c_decl(" ".join(base_tokens) + " " + extra))
        structs[m.group(1)] = fields
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", body):
        opaque.add(m.group(2))
    for m in re.finditer(r"typedef\s+([\w\s\*]+?)\(\s*\*\s*(\w+)\s*\)\s*\(([^)]*)\)\s*;", body):
        params = [p for p in (" ".join(x.split()) for x in m.group(3).split(",")) if p]
        fnptrs[m.group(2)] = (c_type(re.findall(r"\w+|\*", m.group(1))),
                              [c_decl(p) for p in params if p != "void"])
    for m in re.finditer(r"typedef\s+(\w+)\s+(\w+)\s*;", body):
        if m.group(1) != "struct":
            aliases[m.group(2)] = m.group(1)
    for m in re.finditer(r"\bFT_API\s+([^;{}()]*?)\b(ft_\w+)\s*\(([^)]*)\)\s*;", body, re.S):
        ret = c_type(re.findall(r"\w+|\*", m.group(1)))
        params = [p for p in (" ".join(x.split()) for x in m.group(3).split(",")) if p]
        if params == ["void"]:
            params = []
        funcs[m.group(2)] = (ret, [c_decl(p) for p in params])
    declared = len(re.findall(r"\bFT_API\b", body))
    if not funcs or len(funcs) != declared:
        raise ValueError(f"{path}: parsed {len(funcs)} of {declared} FT_API declarations; has the header's "
                         "style changed?")
    return dict(defines=defines, aliases=aliases, opaque=opaque, fnptrs=fnptrs, structs=structs, funcs=funcs,
                struct_header={name: path for name in structs})


def merge_headers(parsed):
    """One view of several headers (names are unique across them)."""
    out = dict(defines={}, aliases={}, opaque=set(), fnptrs={}, structs={}, funcs={}, struct_header={})
    for h in parsed:
        for key, value in h.items():
            out[key].update(value)
    return out


def eval_define(defines, name, seen=()):
    """Integer value of a #define, following FT_ names; None if it is not an integer expression."""
    if name not in defines or name in seen:
        return None
    expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", defines[name])
    for ref in set(re.findall(r"\bFT_\w+", expr)):
        v = eval_define(defines, ref, seen + (name,))
        if v is None:
            return None
        expr = re.sub(rf"\b{ref}\b", f"({v})", expr)
    if not re.fullmatch(r"[\d\s()+\-*/<>|&~x]+", expr):
        return None
    try:
        return int(eval(expr, {"__builtins__": {}}))  # digits and operators only, checked above
    except Exception:
        return None


# ------------------------------------------------------------------------------------------
# Rust side
# ------------------------------------------------------------------------------------------

def split_top(text, sep=","):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def rust_type(text):
    text = " ".join(text.split())
    if text.startswith("*const "):
        return ("ptr", True, rust_type(text[7:]))
    if text.startswith("*mut "):
        return ("ptr", False, rust_type(text[5:]))
    m = re.fullmatch(r"\[(.*);\s*(\d+)\s*\]", text)
    if m:
        return ("array", int(m.group(2)), rust_type(m.group(1)))
    m = re.fullmatch(r'Option<\s*unsafe\s+extern\s+"C"\s+fn\s*\((.*)\)\s*(?:->\s*(.+?))?\s*>', text, re.S)
    if m:
        params = []
        for p in split_top(m.group(1)):
            pname, _, ptype = p.rpartition(":")
            params.append((pname.strip(), rust_type(ptype)))
        return ("fnsig", rust_type(m.group(2)) if m.group(2) else ("base", "c_void"), params)
    if text.startswith("Option<"):
        return ("fnptr", text)
    name = text.split("::")[-1]
    return ("base", RUST_ALIASES.get(name, name))


def parse_rust(path):
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", open(path, encoding="utf-8").read(), flags=re.S)
    aliases = {m.group(1): m.group(2).strip()
               for m in re.finditer(r"\btype\s+(\w+)\s*=\s*([^;]+);", text)}
    consts = {m.group(1): (m.group(2).strip(), m.group(3).strip())
              for m in re.finditer(r"\bconst\s+(\w+)\s*:\s*([^=]+)=\s*([^;]+);", text)}
    structs = {}
    for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?struct\s+(\w+)\s*\{([^}]*)\}", text):
        attrs, name, body = m.groups()
        fields = []
        for f in split_top(body):
            fm = re.fullmatch(r"(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:\s*(.+)", f, re.S)
            if not fm:
                raise ValueError(f"{path}: cannot parse field {f!r} of {name}")
            fields.append((fm.group(1), rust_type(fm.group(2))))
        structs[name] = dict(repr_c=bool(re.search(r"repr\s*\(\s*C\b", attrs)), fields=fields)
    funcs = {}
    for block in re.finditer(r'extern\s+"C"\s*\{', text):
        depth, i = 1, block.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        for fm in re.finditer(r"\bfn\s+(\w+)\s*\((.*?)\)\s*(?:->\s*([^;]+))?;", text[block.end():i - 1], re.S):
            params = []
            for p in split_top(fm.group(2)):
                pname, ptype = p.split(":", 1)
                params.append((pname.strip(), rust_type(ptype)))
            ret = rust_type(fm.group(3)) if fm.group(3) else ("base", "c_void")
            funcs[fm.group(1)] = (ret, params)
    return dict(aliases=aliases, consts=consts, structs=structs, funcs=funcs)


# ------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------

def c_to_rust(t, hdr):
    """The Rust spelling a C type must have, as a type tuple."""
    kind = t[0]
    if kind == "ptr":
        return ("ptr", t[1], c_to_rust(t[2], hdr))
    if kind == "array":
        return ("array", t[1], c_to_rust(t[2], hdr))
    name = t[1]
    if name in hdr["fnptrs"]:
        return ("fnptr", name)
    if name in SCALARS:
        return ("base", SCALARS[name][0])
    return ("base", name)  # ft_status, structs and handles keep their C names


def show(t):
    if t[0] == "ptr":
        return ("*const " if t[1] else "*mut ") + show(t[2])
    if t[0] == "array":
        return f"[{show(t[2])}; {t[1]}]"
    return t[1]


def same(expected, got, rust):
    """expected: from the header, in Rust spelling; got: from the Rust file (aliases resolved)."""
    if expected[0] == "fnptr":
        return got[0] in ("fnptr", "fnsig") or (got[0] == "base" and got[1] == expected[1])
    if expected[0] != got[0]:
        # A Rust alias (ft_status = i32) may stand for the scalar the header aliases.
        if got[0] == "base" and got[1] in rust["aliases"]:
            return same(expected, rust_type(rust["aliases"][got[1]]), rust)
        return False
    if expected[0] in ("ptr", "array"):
        return expected[1] == got[1] and same(expected[2], got[2], rust)
    if expected[1] == got[1]:
        return True
    if got[1] in rust["aliases"]:
        return same(expected, rust_type(rust["aliases"][got[1]]), rust)
    return False


def layout(fields, size_align):
    """(offsets, size) of a C struct / #[repr(C)] struct from (name, type) fields."""
    off, max_align, offsets = 0, 1, []
    for _, t in fields:
        size, align = size_align(t)
        off = (off + align - 1) // align * align
        offsets.append(off)
        off += size
        max_align = max(max_align, align)
    return offsets, (off + max_align - 1) // max_align * max_align


def c_size_align(hdr):
    def sa(t):
        if t[0] in ("ptr", "fnptr"):
            return POINTER, POINTER
        if t[0] == "array":
            size, align = sa(t[2])
            return size * t[1], align
        name = t[1]
        while name in hdr["aliases"]:
            name = hdr["aliases"][name]
        if name in hdr["fnptrs"]:
            return POINTER, POINTER
        if name in hdr["structs"]:
            _, size = layout(hdr["structs"][name], sa)
            return size, max(sa(ft)[1] for _, ft in hdr["structs"][name])
        if name in SCALARS and SCALARS[name][1]:
            return SCALARS[name][1], SCALARS[name][1]
        raise ValueError(f"no size for C type {name}")
    return sa


def rust_size_align(rust):
    def sa(t):
        if t[0] in ("ptr", "fnptr", "fnsig"):
            return POINTER, POINTER
        if t[0] == "array":
            size, align = sa(t[2])
            return size * t[1], align
        name = t[1]
        if name in rust["aliases"]:
            return sa(rust_type(rust["aliases"][name]))
        if name in rust["structs"]:
            fields = rust["structs"][name]["fields"]
            _, size = layout(fields, sa)
            return size, max([sa(ft)[1] for _, ft in fields] or [1])
        if name in RUST_SIZES and RUST_SIZES[name]:
            return RUST_SIZES[name], RUST_SIZES[name]
        raise ValueError(f"no size for Rust type {name}")
    return sa


def compiler_layouts(cc, names, hdr):
    """{struct: (size, [offsets])} as the C compiler lays them out."""
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += [f'#include "{os.path.abspath(h)}"' for h in sorted({hdr["struct_header"][s] for s in names})]
    lines.append("int main(void) {")
    for s in names:
        offs = " ".join(f'printf(" %zu", offsetof({s}, {f}));' for f, _ in hdr["structs"][s])
        lines.append(f'printf("{s} %zu", sizeof({s})); {offs} printf("\\n");')
    lines.append("return 0; }")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
        open(src, "w").write("\n".join(lines) + "\n")
        subprocess.run([cc, "-std=c99", src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        name, size, *offs = line.split()
        result[name] = (int(size), [int(o) for o in offs])
    return result


def check_signature(what, ret, params, cret, cparams, hdr, rust):
    """A Rust signature (ret, params) against the header's (cret, cparams); `what` names it in the
    errors ("fn ft_decode", "type ft_log_fn")."""
    if len(params) != len(cparams):
        return [f"{what}: {len(params)} parameters, the header has {len(cparams)}"]
    errors = []
    for i, ((pn, pt), (cn, ct)) in enumerate(zip(params, cparams)):
        want = c_to_rust(ct, hdr)
        if not same(want, pt, rust):
            errors.append(f"{what}: parameter {i + 1} ({pn}) is {show(pt)}, the header's {cn} is {show(want)}")
    want = c_to_rust(cret, hdr)
    if not same(want, ret, rust):
        errors.append(f"{what}: returns {show(ret)}, the header returns {show(want)}")
    return errors


def check_callbacks(hdr, rust):
    """Each Rust callback alias against the header's function pointer typedef of that name."""
    errors = []
    for name, (cret, cparams) in sorted(hdr["fnptrs"].items()):
        if name not in rust["aliases"]:
            continue
        got = rust_type(rust["aliases"][name])
        if got[0] != "fnsig":
            errors.append(f"type {name}: not Option<unsafe extern \"C\" fn(..)>")
            continue
        _, rret, rparams = got
        errors += check_signature(f"type {name}", rret, rparams, cret, cparams, hdr, rust)
    return errors


# Types the headers take from elsewhere, with the Rust spelling they must have.
EXTERNAL = {"cudaStream_t": ("ptr", False, ("base", "c_void"))}


def check_external(rust):
    errors = []
    for name, want in EXTERNAL.items():
        if name in rust["aliases"] and rust_type(rust["aliases"][name]) != want:
            errors.append(f"type {name} = {rust['aliases'][name]}, must be {show(want)}")
    return errors


def missing_items(hdr, rust):
    """What the headers declare and RUST_FILE does not (--complete)."""
    errors = []
    for name in sorted(set(hdr["funcs"]) - set(rust["funcs"])):
        errors.append(f"fn {name}: declared by the header, missing here")
    for name in sorted(set(hdr["structs"]) | hdr["opaque"]):
        if name not in rust["structs"]:
            errors.append(f"struct {name}: declared by the header, missing here")
    used = {t[1] for _, (_, ps) in hdr["funcs"].items() for _, t in ps if t[0] == "base"}
    used |= {t[2][1] for _, (_, ps) in hdr["funcs"].items() for _, t in ps if t[0] == "ptr" and t[2][0] == "base"}
    for name in sorted(set(hdr["fnptrs"]) | set(hdr["aliases"]) | (set(EXTERNAL) & used)):
        if name not in rust["aliases"]:
            errors.append(f"type {name}: declared by the header, missing here")
    for name in sorted(hdr["defines"]):
        if eval_define(hdr["defines"], name) is not None and name not in rust["consts"]:
            errors.append(f"const {name}: defined by the header, missing here")
    return errors


def main(argv):
    args = list(argv[1:])
    cc = None
    if "--cc" in args:
        i = args.index("--cc")
        cc = args[i + 1]
        del args[i:i + 2]
    complete = "--complete" in args
    args = [a for a in args if a != "--complete"]
    rust_files = [a for a in args if a.endswith(".rs")]
    headers = [a for a in args if a.endswith(".h")]
    if len(rust_files) != 1 or not headers or len(rust_files) + len(headers) != len(args):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    ffi = rust_files[0]
    hdr, rust = merge_headers([parse_header(h) for h in headers]), parse_rust(ffi)
    errors = []

    for name, (ret, params) in sorted(rust["funcs"].items()):
        if name not in hdr["funcs"]:
            errors.append(f"fn {name}: not an FT_API function of the header")
            continue
        cret, cparams = hdr["funcs"][name]
        errors += check_signature(f"fn {name}", ret, params, cret, cparams, hdr, rust)

    checked_structs = []
    for name, s in sorted(rust["structs"].items()):
        if not s["repr_c"]:
            errors.append(f"struct {name}: not #[repr(C)]")
        is_opaque = all(f.startswith("_") and t[0] == "array" and t[1] == 0 for f, t in s["fields"])
        if is_opaque:
            if name not in hdr["opaque"]:
                errors.append(f"struct {name}: opaque here, but the header has no opaque handle of that name")
            continue
        if name not in hdr["structs"]:
            errors.append(f"struct {name}: not a struct of the header")
            continue
        cfields = hdr["structs"][name]
        rnames, cnames = [f for f, _ in s["fields"]], [f for f, _ in cfields]
        if rnames != cnames:
            errors.append(f"struct {name}: fields\n    {rnames}\n  the header has\n    {cnames}")
            continue
        for (fname, rt), (_, ct) in zip(s["fields"], cfields):
            want = c_to_rust(ct, hdr)
            if not same(want, rt, rust):
                errors.append(f"struct {name}.{fname}: {show(rt)}, the header has {show(want)}")
        coffs, csize = layout(cfields, c_size_align(hdr))
        roffs, rsize = layout(s["fields"], rust_size_align(rust))
        if (coffs, csize) != (roffs, rsize):
            errors.append(f"struct {name}: size {rsize}, offsets {roffs}; the header's: size {csize}, "
                          f"offsets {coffs}")
        checked_structs.append((name, csize, coffs))

    for name, (_, value) in sorted(rust["consts"].items()):
        if name.startswith("FT_"):
            cv = eval_define(hdr["defines"], name)
            try:
                rv = int(value.replace("_", ""), 0)
            except ValueError:
                rv = None
            if cv is None or rv is None:
                errors.append(f"const {name}: not an integer #define of the header" if cv is None
                              else f"const {name}: cannot read the value {value!r}")
            elif cv != rv:
                errors.append(f"const {name} = {rv}, the header defines {cv}")
    for name, target in sorted(rust["aliases"].items()):
        if name in hdr["aliases"]:
            want = c_to_rust(("base", hdr["aliases"][name]), hdr)
            if not same(want, rust_type(target), rust):
                errors.append(f"type {name} = {target}, the header has {hdr['aliases'][name]}")

    errors += check_callbacks(hdr, rust)
    errors += check_external(rust)
    if complete:
        errors += missing_items(hdr, rust)

    if cc and checked_structs:
        real = compiler_layouts(cc, [n for n, _, _ in checked_structs], hdr)
        for name, size, offs in checked_structs:
            if real.get(name) != (size, offs):
                errors.append(f"struct {name}: computed size {size}, offsets {offs}, but {cc} gives "
                              f"{real.get(name)} (the checker's layout model is wrong)")

    for e in errors:
        print(f"{ffi}: {e}", file=sys.stderr)
    print(f"{len(rust['funcs'])} functions (of {len(hdr['funcs'])} in {len(headers)} header(s)), "
          f"{len(checked_structs)} structs"
          f"{' (layouts confirmed by ' + os.path.basename(cc) + ')' if cc and checked_structs else ''}, "
          f"{len(rust['consts'])} constants, {len(rust['aliases'])} type aliases checked: "
          f"{'OK' if not errors else str(len(errors)) + ' mismatch(es)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
