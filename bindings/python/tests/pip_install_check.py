#!/usr/bin/env python3
"""Installs bindings/python with pip, offline and without a compiler, into a temporary folder
(pip install --no-build-isolation --no-deps --no-index --target DIR) and imports it from there in a
fresh interpreter. Exits 77 when this python3 has no pip or setuptools."""
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    for mod in ("pip", "setuptools"):
        if importlib.util.find_spec(mod) is None:
            print("SKIP: %s has no %s (Debian: apt-get install python3-%s)" % (sys.executable, mod, mod))
            return 77
    st_version = importlib.metadata.version("setuptools")  # importing setuptools here would clash with pip's
    version = tuple(int(p) for p in st_version.split(".")[:2] if p.isdigit())
    if version < (70, 1) and importlib.util.find_spec("wheel") is None:
        # setuptools before 70.1 builds wheels through the separate wheel package
        print("SKIP: %s has setuptools %s without wheel (Debian: apt-get install python3-wheel)"
              % (sys.executable, st_version))
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        target, work, src = os.path.join(tmp, "site"), os.path.join(tmp, "work"), os.path.join(tmp, "src")
        os.makedirs(work)
        # setuptools writes build/ and *.egg-info next to the sources: build from a copy
        shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
        env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                            "--target", target, src], cwd=work, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr, sep="\n")
            print("FAIL: pip install of %s" % PKG)
            return 1
        code = ("import freetoken, sys; assert freetoken.__file__.startswith(sys.argv[1]), freetoken.__file__; "
                "print(freetoken.__file__, freetoken.version(), *freetoken.library_path())")
        r = subprocess.run([sys.executable, "-c", code, target], cwd=work, env=dict(env, PYTHONPATH=target),
                           capture_output=True, text=True)
        print(r.stdout.strip(), r.stderr.strip())
        if r.returncode != 0:
            print("FAIL: the installed package does not import")
            return 1
        print("OK: pip installed and imported freetoken from", target)
        return 0


if __name__ == "__main__":
    sys.exit(main())
