#!/usr/bin/env python3
"""Checks the manners of the `ft` program: help, version, usage errors (one line, a pointer to
the command's help, exit 2), file errors naming the OS's reason, --plot refusing non-SVG paths,
--backend gpu failing before any load without a GPU, and `ft run` (text and --json) on a small
synthetic checkpoint.

usage: cli_test.py FT_BINARY SOURCE_DIR WORK_DIR CASE
CASE is one of the functions named case_*; exit 0 pass, 1 fail, 77 skipped."""
import errno
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)


class Ft:
    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        # Keep the user's cache and saved profile out of the runs.
        self.env = dict(os.environ)
        self.env["XDG_CACHE_HOME"] = os.path.join(work, "xdg-cache")
        self.env["FT_PROFILE_PATH"] = os.path.join(work, "no-such-profile.json")
        self.env.pop("FT_LOG", None)

    def __call__(self, *args, timeout=300, env=None):
        p = subprocess.run([self.binary, *args], capture_output=True, text=True, env={**self.env, **(env or {})},
                           timeout=timeout, cwd=self.work)
        return p.returncode, p.stdout, p.stderr


def show(args, rc, out, err):
    return "ft %s -> exit %d\n--- stdout:\n%s\n--- stderr:\n%s" % (" ".join(args), rc, out[:2000], err[:2000])


def one_json(args, rc, out, err):
    """The whole of stdout as one JSON value; a Failure if it is not one."""
    try:
        return json.loads(out)
    except ValueError as e:
        raise Failure("stdout is not one JSON value (%s): " % e + show(args, rc, out, err))


def header_version(source_dir):
    text = open(os.path.join(source_dir, "include", "freetoken.h")).read()
    parts = [re.search(r"#define FT_VERSION_%s (\d+)" % k, text).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def case_version(ft, source_dir, work):
    outs = []
    for args in (["--version"], ["version"]):
        rc, out, err = ft(*args)
        expect(rc == 0, show(args, rc, out, err))
        first = out.splitlines()[0] if out else ""
        expect(first == "ft (FreeToken) " + header_version(source_dir),
               "first line %r is not 'ft (FreeToken) %s'" % (first, header_version(source_dir)))
        expect("oneDNN" in out and "CUDA" in out, "no build info: " + out)
        expect(err == "", "stderr not empty: " + err)
        outs.append(out)
    expect(outs[0] == outs[1], "ft --version and ft version differ")


# Each command's help: its first line, options it must list and options of other commands it
# must not list.
HELPS = {
    "info": ("usage: ft info", ["--no-gpu", "--threads"], ["--steps", "--plot"]),
    "run": ("usage: ft run", ["--steps", "--tokens", "--backend", "--cache-dir", "--json", "--format"], ["--plot", "--formats", "--seconds"]),
    "profile": ("usage: ft profile", ["--formats", "--seconds", "--out", "--plot", "--json"], ["--steps", "--cache-dir"]),
    "version": ("usage: ft version", [], ["--steps"]),
}


def case_help(ft, source_dir, work):
    for args in (["--help"], ["-h"], ["help"]):
        rc, out, err = ft(*args)
        expect(rc == 0 and err == "", show(args, rc, out, err))
        expect(out.startswith("usage: ft <command>"), show(args, rc, out, err))
        for c in HELPS:
            expect(re.search(r"^  %s\b" % c, out, re.M), "main help does not list %s:\n%s" % (c, out))
    for cmd, (first, has, hasnt) in HELPS.items():
        for args in ([cmd, "--help"], [cmd, "-h"], ["help", cmd], [cmd, "--steps", "abc", "--help"]):
            rc, out, err = ft(*args)
            expect(rc == 0 and err == "", show(args, rc, out, err))
            expect(out.splitlines()[0].startswith(first), show(args, rc, out, err))
            for opt in has:
                expect(opt in out, "%s does not list %s:\n%s" % (args, opt, out))
            for opt in hasnt:
                expect(opt not in out, "%s lists another command's %s:\n%s" % (args, opt, out))


# argv -> (text the first stderr line must hold, the command whose help it points to).
USAGE_ERRORS = [
    ([], "missing command", ""),
    (["frobnicate"], "unknown command 'frobnicate'", ""),
    (["--bogus"], "unknown option '--bogus'", ""),
    (["help", "frobnicate"], "frobnicate", ""),
    (["run", "--bogus"], "unknown option '--bogus'", "run"),
    (["run", "--steps", "abc"], "--steps expects an integer", "run"),
    (["run", "--steps", "0"], "--steps expects an integer", "run"),
    (["run", "--steps"], "--steps needs a value", "run"),
    (["run", "--tokens", "1.5"], "--tokens expects an integer", "run"),
    (["run", "--backend", "foo"], "unknown backend 'foo'", "run"),
    (["run", "--format", "zip"], "unknown format 'zip'", "run"),
    (["run", "--cache-fraction", "2"], "--cache-fraction expects a number", "run"),
    (["run", "--plot", "x.svg"], "unknown option '--plot'", "run"),
    (["run", "--no-gpu", "--backend", "gpu"], "--no-gpu", "run"),
    (["run", "a", "b"], "more than one model path", "run"),
    (["run", "model-dir", "--format", "q4_0"], "--format", "run"),
    (["profile", "--steps", "3"], "unknown option '--steps'", "profile"),
    (["profile", "--seconds", "-1"], "--seconds expects a number", "profile"),
    (["profile", "--plot", "x.png"], "SVG", "profile"),
    (["profile", "--plot", "plot"], "SVG", "profile"),
    (["profile", "--formats", "bogus"], "unknown format 'bogus'", "profile"),
    (["profile", "extra"], "unexpected argument 'extra'", "profile"),
    (["info", "--json"], "unknown option '--json'", "info"),
    (["version", "--steps", "1"], "unknown option '--steps'", "version"),
]


def case_usage_errors(ft, source_dir, work):
    for args, text, cmd in USAGE_ERRORS:
        rc, out, err = ft(*args)
        lines = err.splitlines()
        expect(rc == 2, "exit %d, not 2: " % rc + show(args, rc, out, err))
        expect(out == "", "stdout not empty: " + show(args, rc, out, err))
        expect(len(lines) == 2, "not one line plus the pointer: " + show(args, rc, out, err))
        expect(lines[0].startswith("ft: ") and text in lines[0], "first line lacks %r: " % text + show(args, rc, out, err))
        see = "see 'ft%s --help'" % (" " + cmd if cmd else "")
        expect(lines[1] == see, "second line is not %r: " % see + show(args, rc, out, err))
    expect(not os.path.exists(os.path.join(work, "x.png")), "--plot x.png created the file")


def case_plot_refused(ft, source_dir, work):
    # Refused at once (no measuring) and nothing written, whatever the case of the extension.
    for path in ("out.png", "out.svg.png", "out.SVGZ", "svg"):
        args = ["profile", "--no-gpu", "--seconds", "1", "--out", os.path.join(work, "p.json"), "--plot", os.path.join(work, path)]
        rc, out, err = ft(*args, timeout=20)
        expect(rc == 2 and "--plot writes SVG only" in err, show(args, rc, out, err))
        expect(not os.path.exists(os.path.join(work, path)), path + " was created")
        expect(not os.path.exists(os.path.join(work, "p.json")), "the profile ran before the refusal")


def case_plot_svg(ft, source_dir, work):
    # A short CPU-only profile of one format: the .svg path gets an SVG document, and with --json
    # stdout stays one JSON value (the plot's line goes to stderr).
    import xml.etree.ElementTree as ET
    svg = os.path.join(work, "bandwidth.SVG")
    args = ["profile", "--no-gpu", "--seconds", "1", "--formats", "q4_0", "--threads", "2", "--json",
            "--out", os.path.join(work, "p.json"), "--plot", svg]
    rc, out, err = ft(*args, timeout=120)
    expect(rc == 0, show(args, rc, out, err))
    one_json(args, rc, out, err)
    expect(svg in err, "no plot line on stderr: " + show(args, rc, out, err))
    root = ET.parse(svg).getroot()
    expect(root.tag.endswith("svg"), "the plot's root element is %r" % root.tag)


def case_profile_gguf(ft, source_dir, work):
    # A short CPU-only profile of three GGUF block formats: the table has a row per format with a
    # positive CPU figure and its kernel, and the saved file an entry per format.
    saved = os.path.join(work, "p.json")
    args = ["profile", "--no-gpu", "--seconds", "3", "--formats", "q8_0,q4_k,iq4_xs", "--threads", "2", "--out", saved]
    rc, out, err = ft(*args, timeout=120)
    expect(rc == 0, show(args, rc, out, err))
    for name in ("q8_0", "q4_k", "iq4_xs"):
        rows = [line.split() for line in out.splitlines() if line.split()[:1] == [name]]
        expect(len(rows) == 1, "not one %s row: " % name + show(args, rc, out, err))
        expect(float(rows[0][2]) > 0, "%s's CPU GB/s is not positive: " % name + show(args, rc, out, err))
        expect(rows[0][-1].startswith(name + "-"), "%s's CPU kernel is %r" % (name, rows[0][-1]))
        entry = json.load(open(saved))["dtype_kernels"][name]
        expect(entry["cpu_moe_gbs"] > 0 and entry["expert_bytes"] > 0, "%s entry: %s" % (name, entry))
    expect("q2_k" not in json.load(open(saved))["dtype_kernels"], "a format not asked for was measured")


def case_missing_files(ft, source_dir, work):
    enoent = os.strerror(errno.ENOENT)
    missing = os.path.join(work, "nonexistent", "model")
    empty = os.path.join(work, "empty-dir")
    os.makedirs(empty, exist_ok=True)
    for args, names in ((["run", missing], missing), (["info", missing], missing), (["run", empty], "config.json")):
        rc, out, err = ft(*args)
        first = err.splitlines()[0] if err else ""
        expect(rc == 1, "exit %d, not 1: " % rc + show(args, rc, out, err))
        expect(first.startswith("ft: ") and names in first and enoent in first,
               "first stderr line does not name %r and %r: " % (names, enoent) + show(args, rc, out, err))


def has_gpu(ft):
    rc, out, err = ft("info")
    expect(rc == 0, show(["info"], rc, out, err))
    engine = [l for l in out.splitlines() if l.startswith("engine")]
    expect(engine, "ft info printed no engine line:\n" + out)
    return "no GPU" not in engine[0]


def case_info_onednn_bf16(ft, source_dir, work):
    # oneDNN capped at AVX2 has no bf16 matmul: ft info must say the path is off.
    rc, out, err = ft("info", env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    expect(rc == 0, show(["info"], rc, out, err))
    cpu = [l for l in out.splitlines() if l.startswith("cpu ")]
    expect(cpu and "oneDNN bf16 matmul: no" in cpu[0], "ft info under ONEDNN_MAX_CPU_ISA=AVX2:\n" + out)


def case_gpu_backend_without_gpu(ft, source_dir, work):
    if has_gpu(ft):
        print("skipped: this machine has a usable GPU")
        return SKIP
    for backend in ("gpu", "offload", "hybrid"):
        cache = os.path.join(work, "gpu-cache-" + backend)
        args = ["run", "--backend", backend, "--cache-dir", cache, "--steps", "1"]
        rc, out, err = ft(*args, timeout=60)
        lines = err.splitlines()
        expect(rc == 1, "exit %d, not 1: " % rc + show(args, rc, out, err))
        expect(lines and lines[0].startswith("ft: --backend %s needs a GPU" % backend), show(args, rc, out, err))
        expect(out == "", "it printed results: " + show(args, rc, out, err))
        # Before anything was loaded: not even the synthetic checkpoint was written.
        expect(not os.path.exists(cache), "the synthetic checkpoint was written first: " + show(args, rc, out, err))


# The smallest synthetic checkpoint (GGUF Q4_0, about 170 MB), shared by the run cases; the cpu
# backend prints the same lines with or without a GPU.
RUN_ARGS = ["--format", "q4_0", "--threads", "2", "--seed", "3", "--backend", "cpu"]


def run_cache(work):
    # Shared by run_text (which writes it afresh) and run_json (which reads it).
    return os.path.join(os.path.dirname(work), "synthetic-cache")


MODEL_LINE = re.compile(r"^model +(\S+): (\d+) MoE layers \(first at layer (\d+) of (\d+)\), (\d+) experts, top-(\d+)$")
DECODE_LINE = re.compile(r"^decode +(\d+) steps x (\d+) token\(s\) x (\d+) layers: ([0-9.]+) tokens/s")


def case_run_text(ft, source_dir, work):
    shutil.rmtree(run_cache(work), ignore_errors=True)
    args = ["run", "--cache-dir", run_cache(work), "--steps", "2", "--tokens", "2"] + RUN_ARGS
    rc, out, err = ft(*args)
    expect(rc == 0, show(args, rc, out, err))
    # The one-time notice goes to stderr; stdout holds the results, first the model.
    expect("writing a synthetic" not in out, "the notice is on stdout: " + show(args, rc, out, err))
    expect(err.startswith("ft: writing a synthetic"), "no notice on stderr: " + show(args, rc, out, err))
    if not os.path.exists(os.path.join(run_cache(work), "synthetic-q4_0", ".complete")):
        raise Failure("no synthetic checkpoint was kept: " + show(args, rc, out, err))
    lines = out.splitlines()
    expect(MODEL_LINE.match(lines[0]), "first stdout line is not the model: " + show(args, rc, out, err))
    labels = [l.split()[0] for l in lines if l and not l.startswith(" ")]
    for label in ("model", "engine", "backend", "profile", "memory", "decode", "per", "bandwidth"):
        expect(label in labels, "no %r line: " % label + show(args, rc, out, err))
    d = [DECODE_LINE.match(l) for l in lines if l.startswith("decode")][0]
    expect(d and d.group(1, 2, 3) == ("2", "2", "2"), "decode line: " + show(args, rc, out, err))
    expect(float(d.group(4)) > 0, "tokens/s not positive")
    # run_json compares its figures with this text.
    with open(os.path.join(os.path.dirname(work), "run_text.out"), "w") as f:
        f.write(out)


def case_run_json(ft, source_dir, work):
    args = ["run", "--cache-dir", run_cache(work), "--steps", "3", "--json"] + RUN_ARGS
    rc, out, err = ft(*args)
    expect(rc == 0, show(args, rc, out, err))
    j = one_json(args, rc, out, err)
    expect(isinstance(j, dict), "not a JSON object")
    for key in ("model", "load", "engine", "backend", "profile", "memory", "decode"):
        expect(key in j, "no %r: %s" % (key, out))
    m, d = j["model"], j["decode"]
    expect(m["format"] == "q4_0" and m["synthetic"] is True, "model: %s" % m)
    expect(d["steps"] == 3 and d["tokens"] == 1 and d["layers"] == m["moe_layers"], "decode: %s" % d)
    expect(d["tokens_per_s"] > 0 and 0 < d["layer_ms_median"] <= d["layer_ms_p90"], "decode figures: %s" % d)
    expect(j["memory"]["read_gbs"] > 0 and j["memory"]["threads"] == 2, "memory: %s" % j["memory"])
    expect(j["backend"]["name"] == "cpu" or j["engine"]["gpu"], "backend %s without a GPU" % j["backend"])
    expect("bandwidth" in j or "gpu" in j, "no bandwidth figures: " + out)
    if "bandwidth" in j:
        b = j["bandwidth"]
        expect(b["expert_gbs"] > 0 and abs(b["fraction_of_read"] - b["expert_gbs"] / j["memory"]["read_gbs"]) < 1e-9,
               "bandwidth: %s" % b)
    expect(j["profile"]["state"] == "none", "profile: %s (FT_PROFILE_PATH names no file)" % j["profile"])

    # The text output of run_text (same checkpoint) shows the same model figures.
    text = open(os.path.join(os.path.dirname(work), "run_text.out")).read()
    mm = MODEL_LINE.match(text.splitlines()[0])
    expect(mm, "run_text's first line: " + text)
    expect(mm.groups() == (m["architecture"], str(m["moe_layers"]), str(m["first_moe_layer"]), str(m["total_layers"]),
                           str(m["experts"]), str(m["top_k"])), "text %s vs JSON %s" % (mm.groups(), m))


# llama.cpp's Q4_K_M mix as `ft run --format q4_k_m` writes it: gate/up q4_k in every layer, down
# q6_k in layer 0 and q4_k in layer 1. Bytes per expert from the ggml block sizes (256 elements).
Q4_K_BLOCK, Q6_K_BLOCK = 144, 210


def q4_k_m_shares(h, i):
    gate_up = 2 * i * h // 256 * Q4_K_BLOCK
    down = {"q4_k": h * i // 256 * Q4_K_BLOCK, "q6_k": h * i // 256 * Q6_K_BLOCK}
    q4 = 2 * gate_up + down["q4_k"]
    total = q4 + down["q6_k"]
    return {"q4_k": q4 / total, "q6_k": down["q6_k"] / total}


def case_run_mixed(ft, source_dir, work):
    # A synthetic GGUF mixing types per matrix and layer: ft info and ft run state the mix with each
    # type's share of the bytes, and the profile line the figures of every type, blended by share.
    cache = os.path.join(work, "cache")
    profile = os.path.join(work, "profile.json")
    with open(profile, "w") as f:
        json.dump({"version": 4, "dtype_kernels": {"q4_k": {"cpu_moe_gbs": 40.0, "pcie_gather_gbs": 20.0},
                                                   "q6_k": {"cpu_moe_gbs": 25.0, "pcie_gather_gbs": 20.0}}}, f)
    env = {"FT_PROFILE_PATH": profile}
    args = ["run", "--format", "q4_k_m", "--cache-dir", cache, "--threads", "2", "--steps", "1", "--backend", "cpu", "--json"]
    rc, out, err = ft(*args, env=env)
    expect(rc == 0, show(args, rc, out, err))
    j = one_json(args, rc, out, err)
    m, p = j["model"], j["profile"]
    want = q4_k_m_shares(m["hidden_size"], m["intermediate_size"])
    expect(m["mixed_formats"] is True, "model: %s" % m)
    expect([(x["first_layer"], x["last_layer"], x["gate_up"], x["down"]) for x in m["layer_formats"]] ==
           [(0, 0, "q4_k", "q6_k"), (1, 1, "q4_k", "q4_k")], "layer formats: %s" % m["layer_formats"])
    got = {x["format"]: x["share"] for x in m["format_shares"]}
    expect(got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-9 for k in want),
           "model shares %s, want %s" % (got, want))
    expect(p["state"] == "applies", "profile: %s" % p)
    got = {x["format"]: x for x in p["formats"]}
    expect(got.keys() == want.keys() and all(abs(got[k]["share"] - want[k]) < 1e-9 and got[k]["measured"] for k in want),
           "profile formats %s, want shares %s" % (p["formats"], want))
    expect(got["q4_k"]["cpu_gbs"] == 40.0 and got["q6_k"]["cpu_gbs"] == 25.0, "profile formats: %s" % p["formats"])
    blended = 1.0 / (want["q4_k"] / 40.0 + want["q6_k"] / 25.0)
    expect(abs(p["cpu_gbs"] - blended) < 1e-9, "blended CPU GB/s %s, want %s" % (p["cpu_gbs"], blended))

    # The same as text: the model's format field and the profile line name both types and shares.
    mix = "q4_k %.0f%% + q6_k %.0f%%" % (100 * want["q4_k"], 100 * want["q6_k"])
    args = ["run", "--format", "q4_k_m", "--cache-dir", cache, "--threads", "2", "--steps", "1", "--backend", "cpu"]
    rc, out, err = ft(*args, env=env)
    expect(rc == 0, show(args, rc, out, err))
    prof = [l for l in out.splitlines() if l.startswith("profile")]
    expect(prof and mix + " of the expert bytes" in prof[0] and "CPU %.1f GB/s blended (q4_k 40.0, q6_k 25.0)" % blended in prof[0],
           "profile line, want %r: " % mix + show(args, rc, out, err))
    expect("mixed " + mix + " of the bytes" in out, "model lines, want %r: " % mix + show(args, rc, out, err))

    # A profile without q6_k figures: the line names the missing type and the mix.
    with open(profile, "w") as f:
        json.dump({"version": 4, "dtype_kernels": {"q4_k": {"cpu_moe_gbs": 40.0, "pcie_gather_gbs": 20.0}}}, f)
    rc, out, err = ft(*args, env=env)
    expect(rc == 0, show(args, rc, out, err))
    prof = [l for l in out.splitlines() if l.startswith("profile")]
    expect(prof and "has no figures for q6_k (the model: " + mix in prof[0], show(args, rc, out, err))

    # The GB/s figures count each routed expert at its own layer's size (layer 0's is larger): on
    # the cpu backend (the JSON run above) and, with a GPU, on the gpu backend.
    h, i = m["hidden_size"], m["intermediate_size"]
    gate_up = 2 * i * h // 256 * Q4_K_BLOCK
    sizes = (gate_up + h * i // 256 * Q6_K_BLOCK, gate_up + h * i // 256 * Q4_K_BLOCK)

    def bytes_per_routed_expert(run, figure):
        d = run["decode"]
        seconds = d["steps"] * d["tokens"] / d["tokens_per_s"]
        return figure * 1e9 * seconds / (d["distinct_experts_per_layer_step"] * d["steps"] * d["layers"])

    per_expert = bytes_per_routed_expert(j, j["bandwidth"]["expert_gbs"])
    expect(sizes[1] * (1 - 1e-9) < per_expert < sizes[0] * (1 - 1e-3),
           "cpu: bytes per routed expert %.0f, not between the layers' %s" % (per_expert, sizes))
    if has_gpu(ft):
        gargs = ["run", "--format", "q4_k_m", "--cache-dir", cache, "--threads", "2", "--steps", "4", "--backend", "gpu", "--json"]
        rc, out, err = ft(*gargs, env=env)
        expect(rc == 0, show(gargs, rc, out, err))
        g = one_json(gargs, rc, out, err)
        per_expert = bytes_per_routed_expert(g, g["gpu"]["expert_gbs"])
        expect(sizes[1] * (1 - 1e-9) < per_expert < sizes[0] * (1 - 1e-3),
               "gpu: bytes per routed expert %.0f, not between the layers' %s: %s" % (per_expert, sizes, g))

    # ft info on the file itself states the mix the same way.
    model = os.path.join(cache, "synthetic-q4_k_m", "model.gguf")
    rc, out, err = ft("info", model)
    expect(rc == 0, show(["info", model], rc, out, err))
    expect("mixed " + mix + " of the bytes" in out and "0 q4_k/q6_k, 1 q4_k" in out, show(["info", model], rc, out, err))


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    binary, source_dir, work_root, case = sys.argv[1:]
    fn = globals().get("case_" + case)
    if not fn:
        print("unknown case " + case)
        return 2
    # A fresh folder per case, so cases can run in parallel and nothing is left from a last run.
    work = os.path.join(work_root, case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        r = fn(Ft(binary, work), source_dir, work)
    except Failure as f:
        print("FAIL %s: %s" % (case, f))
        return 1
    if r == SKIP:
        return SKIP
    print("ok %s" % case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
