#!/usr/bin/env python3
"""Checks the layering of the source tree (docs/ARCHITECTURE.md, "Layers").

    lib/core  <  cpu, cuda  <  lib/engine  <  tools, bindings

Walks the #include graph of every source and header under lib/core, cpu, cuda, lib/engine,
tools and bindings and fails on an include that runs back up: lib/core includes nothing of
cpu, cuda or lib/engine; cpu and cuda include nothing of lib/engine; cpu and cuda include
nothing of each other except the exceptions listed in EXCEPTIONS. Also fails when a CMake file
of those folders adds another module's folder to a target's include path (a module exports its
own include/ only; dependencies are target_link_libraries). Python 3 standard library only.

Usage: scripts/check-layers.py [REPO_ROOT]    exit 0: clean, 1: violations (listed), 2: bad tree
"""

import os
import re
import sys

# (folder prefix, layer, rank). The first matching prefix names a file's layer; the module is the
# folder right below the prefix (lib/core/model, cuda/gather, cpu).
LAYERS = [
    ("lib/core/", "core", 0),
    ("cpu/", "cpu", 1),
    ("cuda/", "cuda", 1),
    ("lib/engine/", "engine", 2),
    ("tools/", "tools", 3),
    ("bindings/", "bindings", 3),
]
PUBLIC = "include/"  # the public C headers: every layer may include them

# Includes between cpu and cuda that the design allows, as (including module, included module):
# the hybrid GPU backend computes its CPU share with the CPU executor and the CPU backend's view
# of the banks (ft/cpu.hpp, ft/cpu_backend.hpp).
EXCEPTIONS = {
    ("cuda/backends", "cpu"): "the hybrid backend's CPU share runs the CPU executor",
}

SOURCE_EXT = (".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(rel):
    """(layer, rank, module) of a repository path; (None, None, None) outside the layers."""
    for prefix, name, rank in LAYERS:
        if rel.startswith(prefix):
            rest = rel[len(prefix):]
            module = prefix + rest.split("/", 1)[0] if "/" in rest and name != "cpu" else prefix.rstrip("/")
            return name, rank, module
    if rel.startswith(PUBLIC):
        return "public", -1, "include"
    return None, None, None


def walk_sources(root):
    for prefix, _, _ in LAYERS:
        top = os.path.join(root, prefix)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in ("target", "build", "__pycache__", ".git"))
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def header_index(root, files):
    """Maps 'ft/x.hpp' (a path below some include/ folder) to the files that provide it."""
    index = {}
    for rel in files:
        parts = rel.split("/")
        for i, p in enumerate(parts[:-1]):
            if p == "include":
                index.setdefault("/".join(parts[i + 1:]), []).append(rel)
    for dirpath, _, filenames in os.walk(os.path.join(root, PUBLIC)):
        for f in filenames:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            index.setdefault(os.path.relpath(rel, PUBLIC), []).append(rel)
    return index


def resolve(root, including, name, index):
    local = os.path.normpath(os.path.join(os.path.dirname(including), name))
    if os.path.isfile(os.path.join(root, local)):
        return [local]
    return index.get(name, [])


def check_includes(root):
    files = list(walk_sources(root))
    index = header_index(root, files)
    problems = []
    edges = 0
    for rel in files:
        src_layer, src_rank, src_module = layer_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                targets = resolve(root, rel, m.group(2), index)
                if not targets:
                    continue  # a system or third-party header
                if len(targets) > 1:
                    modules = sorted({layer_of(t)[2] for t in targets})
                    if len(modules) > 1:
                        problems.append(f"{rel}:{lineno}: \"{m.group(2)}\" is provided by several modules: "
                                        + ", ".join(targets))
                        continue
                dst_layer, dst_rank, dst_module = layer_of(targets[0])
                edges += 1
                if dst_layer is None or dst_layer == "public" or dst_module == src_module:
                    continue
                where = f"{rel}:{lineno}: includes {targets[0]}"
                if dst_rank > src_rank:
                    problems.append(f"{where} ({src_layer} may not include {dst_layer}: it sits above)")
                elif dst_rank == src_rank and dst_layer != src_layer:
                    key = (src_module, dst_module)
                    if key not in EXCEPTIONS:
                        problems.append(f"{where} ({src_layer} and {dst_layer} are independent; "
                                        "add a documented exception to EXCEPTIONS if this is by design)")
    return problems, len(files), edges


CMAKE_INCLUDE_RE = re.compile(r"target_include_directories\s*\(([^)]*)\)", re.S)


def check_cmake(root):
    """A module's include path holds its own folders only: no '..' and no absolute source paths."""
    problems = []
    for prefix, _, _ in LAYERS[:4]:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, prefix)):
            dirnames.sort()
            if "CMakeLists.txt" not in filenames:
                continue
            rel = os.path.relpath(os.path.join(dirpath, "CMakeLists.txt"), root)
            with open(os.path.join(root, rel), encoding="utf-8") as fh:
                text = fh.read()
            for m in CMAKE_INCLUDE_RE.finditer(text):
                lineno = text.count("\n", 0, m.start()) + 1
                for arg in m.group(1).split():
                    if re.search(r"\$\{PROJECT_SOURCE_DIR\}/include>?$", arg):
                        continue  # the public C headers
                    if ".." in arg or "PROJECT_SOURCE_DIR" in arg or "CMAKE_SOURCE_DIR" in arg:
                        problems.append(f"{rel}:{lineno}: include path {arg} reaches outside the module "
                                        "(link the module's target instead)")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    for prefix, _, _ in LAYERS[:4]:
        if not os.path.isdir(os.path.join(root, prefix)):
            print(f"check-layers: {prefix} not found under {root}", file=sys.stderr)
            return 2
    problems, nfiles, edges = check_includes(root)
    problems += check_cmake(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} violation(s) in {nfiles} files", file=sys.stderr)
        return 1
    print(f"check-layers: {nfiles} files, {edges} includes of our own headers, none runs back up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
