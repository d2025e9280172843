#!/usr/bin/env python3
"""Runs one test module of the freetoken package with unittest.

Usage: run.py MODULE [--require numpy,torch] [-- unittest args]
Exits 77 (ctest's SKIP_RETURN_CODE) when a required package is missing, 1 on failures."""
import importlib
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the freetoken package itself

SKIP = 77


def main(argv):
    args = argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    module, required = args[0], []
    if "--require" in args:
        required = [r for r in args[args.index("--require") + 1].split(",") if r]
    for name in required:
        try:
            importlib.import_module(name)
        except ImportError as e:
            print("SKIP: %s needs %s (%s); %s has no %s (Debian: apt-get install python3-%s)"
                  % (module, name, e, sys.executable, name, name))
            return SKIP
    suite = unittest.defaultTestLoader.loadTestsFromName(module)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.testsRun == len(result.skipped):
        print("SKIP: every test of %s skipped" % module)
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
