"""The freetoken package's API on the CPU: library lookup, errors, handle lifetimes, array checks,
route/decode against a numpy reference, splitting, log and progress callbacks."""
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest
import weakref

import numpy as np

import freetoken as ft
from ckpt import from_bf16, reference_moe, rel_l2, to_bf16, write_qwen3_moe

try:
    import torch
except ImportError:
    torch = None

H, I, E, K = 64, 32, 8, 2


class Checkpoint(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ft_py_api_")
        cls.ckpt = os.path.join(cls.tmp, "qwen3")
        cls.values = write_qwen3_moe(cls.ckpt, layers=2, experts=E, top_k=K, hidden=H, inter=I, seed=1)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def engine(self):
        return ft.Engine(device=ft.FT_DEVICE_NONE, cpu_threads=2)


class Library(unittest.TestCase):
    def test_library_path_says_where_it_came_from(self):
        path, source = ft.library_path()
        if os.environ.get("FREETOKEN_LIBRARY"):
            self.assertEqual(source, "FREETOKEN_LIBRARY")
            self.assertEqual(path, os.environ["FREETOKEN_LIBRARY"])
        self.assertTrue(os.path.exists(path), path)

    def lookup(self, env):
        """library_path() in a fresh interpreter with `env` (FREETOKEN_LIBRARY unset)."""
        import subprocess
        full = {k: v for k, v in os.environ.items() if k not in ("FREETOKEN_LIBRARY", "LD_LIBRARY_PATH")}
        full.update(env)
        full["PYTHONPATH"] = os.path.dirname(os.path.dirname(ft.__file__))
        code = "import freetoken; print('|'.join(freetoken.library_path()))"
        r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)
        return r.returncode, r.stdout.strip(), r.stderr

    def test_lookup_through_pkg_config_then_the_system_loader(self):
        import shutil as sh
        path, _ = ft.library_path()
        libdir = os.path.dirname(os.path.realpath(path))
        if not sh.which("pkg-config"):
            self.skipTest("pkg-config is not installed")
        with tempfile.TemporaryDirectory() as pc:
            with open(os.path.join(pc, "freetoken.pc"), "w") as f:
                f.write("libdir=%s\nName: freetoken\nDescription: test\nVersion: 0.3.0\nLibs: -L${libdir} "
                        "-lfreetoken\n" % libdir)
            rc, out, err = self.lookup({"PKG_CONFIG_LIBDIR": pc, "PKG_CONFIG_PATH": ""})
            self.assertEqual(rc, 0, err)
            self.assertEqual(out.split("|")[1], "pkg-config")
            self.assertTrue(out.split("|")[0].startswith(libdir))
        with tempfile.TemporaryDirectory() as empty:
            rc, out, err = self.lookup({"PKG_CONFIG_LIBDIR": empty, "PKG_CONFIG_PATH": "", "LD_LIBRARY_PATH": libdir})
            self.assertEqual(rc, 0, err)
            self.assertEqual(out.split("|")[1], "system loader")
            self.assertEqual(os.path.realpath(out.split("|")[0]), os.path.realpath(path))
            rc, out, err = self.lookup({"PKG_CONFIG_LIBDIR": empty, "PKG_CONFIG_PATH": "",
                                        "FREETOKEN_LIBRARY": os.path.join(empty, "libnothing.so")})
            self.assertNotEqual(rc, 0)
            self.assertIn("FREETOKEN_LIBRARY", err)

    def test_version(self):
        self.assertEqual(ft.version(), "%d.%d.%d" % (ft.FT_VERSION_MAJOR, ft.FT_VERSION_MINOR, ft.FT_VERSION_PATCH))
        self.assertEqual(ft.version_number(), ft.FT_VERSION_NUMBER)

    def test_status_names(self):
        self.assertEqual(ft.status_string(ft.FT_ERR_FORMAT), "FT_ERR_FORMAT")
        self.assertEqual(ft.status_string(12345), "FT_ERR_UNKNOWN")

    def test_build_info(self):
        info = ft.build_info()
        self.assertEqual(info["version_number"], ft.FT_VERSION_NUMBER)
        self.assertIsInstance(info["cpu_isa"], str)
        self.assertTrue(info["cpu_isa"])

    def test_ep_without_a_gpu_is_refused(self):
        # Without CUDA in the build: UNSUPPORTED; with CUDA but no GPU: NO_DEVICE (or UNSUPPORTED
        # where NCCL is missing). Where a GPU and NCCL exist the group is made: the GPU tests cover it.
        try:
            groups = ft.EpGroup.bootstrap_local([0], num_experts=8, top_k=2, hidden=128, max_tokens=4)
        except ft.Error as e:
            expected = (ft.FT_ERR_UNSUPPORTED, ft.FT_ERR_NO_DEVICE) if ft.build_info()["cuda"] else (ft.FT_ERR_UNSUPPORTED,)
            self.assertIn(e.status, expected, str(e))
            self.assertTrue(e.message)
            return
        for g in groups:
            g.close()
        self.skipTest("this machine has a GPU and NCCL")

    def test_profile_load_of_a_missing_file(self):
        with self.assertRaises(ft.Error) as cm:
            ft.Profile.load("/nonexistent/benchbw.json")
        self.assertEqual(cm.exception.status, ft.FT_ERR_IO)
        self.assertEqual(cm.exception.status_name, "FT_ERR_IO")


class Errors(Checkpoint):
    def test_load_of_a_missing_directory_raises_io_with_the_message(self):
        with self.engine() as engine:
            with self.assertRaises(ft.Error) as cm:
                ft.Model.load(engine, os.path.join(self.tmp, "missing"))
        e = cm.exception
        self.assertEqual(e.status, ft.FT_ERR_IO)
        self.assertEqual(e.status_name, "FT_ERR_IO")
        self.assertIn("missing", e.message)
        self.assertIn("ft_model_load", str(e))

    def test_unknown_parameter_names_are_refused(self):
        with self.assertRaises(TypeError):
            ft.Engine(device=ft.FT_DEVICE_NONE, no_such_field=1)
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model:
            with self.assertRaises(ValueError):
                ft.Session(model, backend="fastest")

    def test_bad_expert_id_names_the_token(self):
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model, \
                ft.Session(model, backend="cpu") as s:
            x = to_bf16(np.ones((2, H)))
            ids = np.array([[0, 1], [2, E]], dtype=np.int32)
            w = np.full((2, K), 0.5, dtype=np.float32)
            with self.assertRaises(ft.Error) as cm:
                s.decode(0, x, ids, w)
            self.assertEqual(cm.exception.status, ft.FT_ERR_INVALID_ARGUMENT)
            self.assertIn("token 1", cm.exception.message)

    def test_non_finite_hidden(self):
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model, \
                ft.Session(model, backend="cpu") as s:
            x = to_bf16(np.full((1, H), np.nan, dtype=np.float32))
            with self.assertRaises(ft.Error) as cm:
                s.decode(0, x, np.zeros((1, K), np.int32), np.ones((1, K), np.float32))
            self.assertEqual(cm.exception.status, ft.FT_ERR_NON_FINITE)

    def test_layer_out_of_range(self):
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model, \
                ft.Session(model, backend="cpu") as s:
            with self.assertRaises(ft.Error) as cm:
                s.decode(5, to_bf16(np.ones((1, H))), np.zeros((1, K), np.int32), np.ones((1, K), np.float32))
            self.assertEqual(cm.exception.status, ft.FT_ERR_INVALID_ARGUMENT)


class Arrays(Checkpoint):
    def setUp(self):
        self.engine_ = self.engine()
        self.model = ft.Model.load(self.engine_, self.ckpt)
        self.s = ft.Session(self.model, backend="cpu")
        self.x = to_bf16(np.random.default_rng(0).normal(0, 1, (3, H)))
        self.ids = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int32)
        self.w = np.full((3, K), 0.5, dtype=np.float32)

    def tearDown(self):
        self.engine_.close()

    def check_raises(self, fragment, *args, **kwargs):
        with self.assertRaises(ft.ArrayError) as cm:
            self.s.decode(0, *args, **kwargs)
        self.assertIn(fragment, str(cm.exception))

    def test_wrong_dtype(self):
        self.check_raises("hidden: element type", self.x.astype(np.float32), self.ids, self.w)
        self.check_raises("expert_ids: element type", self.x, self.ids.astype(np.int64), self.w)
        self.check_raises("expert_weights: element type", self.x, self.ids, self.w.astype(np.float64))

    def test_wrong_shape(self):
        self.check_raises("hidden: shape [3, 32], expected [*, 64]", self.x[:, :32].copy(), self.ids, self.w)
        self.check_raises("expert_ids: shape [3, 3]", self.x, np.zeros((3, 3), np.int32), self.w)
        self.check_raises("out: shape", self.x, self.ids, self.w, out=np.empty((2, H), np.uint16))

    def test_not_contiguous(self):
        wide = np.zeros((3, 2 * H), np.uint16)
        self.check_raises("not C-contiguous", wide[:, ::2], self.ids, self.w)

    def test_read_only_output(self):
        out = np.empty((3, H), np.uint16)
        out.setflags(write=False)
        self.check_raises("read-only", self.x, self.ids, self.w, out=out)

    def test_not_an_array(self):
        self.check_raises("is not an array", [[0] * H] * 3, self.ids, self.w)
        self.check_raises("None given", None, self.ids, self.w)

    def test_out_may_not_alias_hidden(self):
        x = self.x.copy()
        self.check_raises("alias", x, self.ids, self.w, out=x)

    def test_standard_library_buffers(self):
        import array

        def mv(a, code):
            return memoryview(array.array(code, a.ravel().tolist())).cast("B").cast(code, a.shape)
        got = self.s.decode(0, mv(self.x, "H"), mv(self.ids, "i"), mv(self.w, "f"))
        self.assertIsInstance(got, memoryview)
        want = self.s.decode(0, self.x, self.ids, self.w)
        self.assertEqual(list(got.cast("B").cast("H")), want.ravel().tolist())
        self.check_raises("read-only", memoryview(self.x.tobytes()).cast("H", self.x.shape), self.ids, self.w)
        self.check_raises("buffer format", mv(self.x.astype(np.float32), "f"), self.ids, self.w)

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_checks(self):
        xt = torch.from_numpy(self.x.view(np.int16)).view(torch.bfloat16)
        with self.assertRaises(ft.ArrayError) as cm:
            self.s.decode(0, xt.float(), torch.from_numpy(self.ids), torch.from_numpy(self.w))
        self.assertIn("dtype torch.float32", str(cm.exception))
        with self.assertRaises(ft.ArrayError) as cm:
            self.s.decode(0, xt, torch.from_numpy(self.ids).t().contiguous().t(), torch.from_numpy(self.w))
        self.assertIn("not contiguous", str(cm.exception))


class Decode(Checkpoint):
    def test_cache_policy_by_name(self):
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model:
            with ft.Session(model, backend="cpu", cache_policy="frequency") as s:
                self.assertIsNone(s.cache_policy)  # accepted; the cpu backend has no slot cache
            with self.assertRaises(ValueError):
                ft.Session(model, backend="cpu", cache_policy="fifo")
            with self.assertRaises(ft.Error):
                ft.Session(model, backend="cpu", cache_policy=7)

    def test_route_and_decode_match_the_reference(self):
        rng = np.random.default_rng(3)
        T = 5
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model, \
                ft.Session(model, backend="cpu") as s:
            self.assertEqual(s.backend, "cpu")
            self.assertIsNone(s.cache_policy)  # the cpu backend has no slot cache
            self.assertEqual(s.device, ft.FT_DEVICE_NONE)
            self.assertEqual(model.moe_layer(1), 1)
            info = model.info()
            # One format for every matrix of every layer: the mask has its bit alone.
            self.assertEqual(info["mixed_formats"], 0)
            self.assertEqual(info["formats_used"], 1 << info["format"])
            self.assertEqual(model.layer_formats(1), (info["format"], info["format"]))
            with self.assertRaises(ft.Error):
                model.layer_formats(info["num_layers"])
            for layer in range(2):
                x = to_bf16(rng.normal(0, 1, (T, H)))
                logits = rng.normal(0, 1, (T, E)).astype(np.float32)
                ids, w = s.route(layer, logits)
                self.assertEqual(ids.dtype, np.int32)
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                top = np.argsort(-p, axis=1, kind="stable")[:, :K]
                np.testing.assert_array_equal(ids, top)
                want_w = np.take_along_axis(p, top, 1)
                np.testing.assert_allclose(w, want_w / want_w.sum(1, keepdims=True), rtol=1e-5)
                # A model without hash-routed layers: token ids change nothing (ft_route_tokens).
                self.assertEqual(info["hash_layers"], 0)
                tids, tw = s.route(layer, logits, token_ids=np.arange(T, dtype=np.int32))
                np.testing.assert_array_equal(tids, ids)
                np.testing.assert_array_equal(tw, w)
                with self.assertRaises(ft.ArrayError):
                    s.route(layer, logits, token_ids=np.arange(T + 1, dtype=np.int32))
                y = s.decode(layer, x, ids, w)
                ref = reference_moe(self.values, layer, from_bf16(x), ids, w)
                self.assertLess(rel_l2(from_bf16(y), ref), 1e-2)
            st = s.stats()
            self.assertEqual(st["decode_calls"], 2)
            self.assertEqual(st["tokens"], 2 * T)

    def test_router_tensor_is_the_checkpoints(self):
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model:
            view = model.tensor(1, ft.FT_TENSOR_ROUTER_WEIGHT)
            self.assertEqual(view.shape, (E, H))
            got = view.numpy()
            want = self.values["model.layers.1.mlp.gate.weight"]
            if view.dtype == ft.FT_DTYPE_BF16:
                got = from_bf16(got)
            np.testing.assert_array_equal(got, want)
            with self.assertRaises(ft.Error) as cm:
                model.tensor(0, ft.FT_TENSOR_SHARED_GATE)
            self.assertEqual(cm.exception.status, ft.FT_ERR_UNSUPPORTED)
            info = model.info()
            self.assertEqual((info["num_layers"], info["num_experts"], info["top_k"]), (2, E, K))
            self.assertEqual(info["architecture"], "qwen3_moe")

    def test_long_calls_are_split_at_max_tokens(self):
        rng = np.random.default_rng(4)
        T = 7
        x = to_bf16(rng.normal(0, 1, (T, H)))
        ids = rng.integers(0, E, (T, K)).astype(np.int32)
        w = rng.uniform(0, 1, (T, K)).astype(np.float32)
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model:
            with ft.Session(model, backend="cpu", max_tokens=3) as small, \
                    ft.Session(model, backend="cpu", max_tokens=16) as big:
                a = small.decode(0, x, ids, w)
                b = big.decode(0, x, ids, w)
                self.assertEqual(small.stats()["decode_calls"], 3)
                self.assertEqual(big.stats()["decode_calls"], 1)
        self.assertLess(rel_l2(from_bf16(a), from_bf16(b)), 1e-2)
        self.assertLess(rel_l2(from_bf16(a), reference_moe(self.values, 0, from_bf16(x), ids, w)), 1e-2)

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_tensors_give_the_numpy_result(self):
        rng = np.random.default_rng(5)
        x = to_bf16(rng.normal(0, 1, (4, H)))
        ids = rng.integers(0, E, (4, K)).astype(np.int32)
        w = rng.uniform(0, 1, (4, K)).astype(np.float32)
        with self.engine() as engine, ft.Model.load(engine, self.ckpt) as model, \
                ft.Session(model, backend="cpu") as s:
            a = s.decode(0, x, ids, w)
            xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
            b = s.decode(0, xt, torch.from_numpy(ids), torch.from_numpy(w))
            self.assertEqual(b.dtype, torch.bfloat16)
            np.testing.assert_array_equal(b.view(torch.int16).numpy().view(np.uint16), a)
            logits = torch.from_numpy(rng.normal(0, 1, (4, E)).astype(np.float32))
            tid, tw = s.route(0, logits)
            self.assertEqual((tid.dtype, tw.dtype), (torch.int32, torch.float32))


class BuiltFromMemory(unittest.TestCase):
    def test_create_set_finalize(self):
        rng = np.random.default_rng(6)
        with ft.Engine(device=ft.FT_DEVICE_NONE, cpu_threads=1) as engine:
            model = ft.Model.create(engine, num_layers=1, num_experts=2, top_k=1, hidden_size=H,
                                    intermediate_size=I)
            with self.assertRaises(ft.ArrayError):
                model.set_expert(0, 0, ft.FT_PROJ_DOWN, to_bf16(rng.normal(0, 1, (I, H))))  # down is [H, I]
            model.set_expert(0, 0, ft.FT_PROJ_GATE, to_bf16(rng.normal(0, 0.1, (I, H))))
            with self.assertRaises(ft.Error) as cm:
                model.finalize()
            self.assertEqual(cm.exception.status, ft.FT_ERR_STATE)
            self.assertTrue(cm.exception.message)
            with self.assertRaises(ft.Error) as cm:
                model.set_expert(0, 5, ft.FT_PROJ_GATE, to_bf16(rng.normal(0, 0.1, (I, H))))
            self.assertEqual(cm.exception.status, ft.FT_ERR_INVALID_ARGUMENT)


class Lifetimes(Checkpoint):
    def test_with_closes(self):
        with self.engine() as engine:
            self.assertFalse(engine.closed)
        self.assertTrue(engine.closed)
        with self.assertRaises(ft.Error) as cm:
            engine.info()
        self.assertEqual(cm.exception.status, ft.FT_ERR_STATE)

    def test_closing_the_engine_closes_models_and_sessions_first(self):
        engine = self.engine()
        model = ft.Model.load(engine, self.ckpt)
        session = ft.Session(model, backend="cpu")
        engine.close()
        self.assertTrue(model.closed and session.closed)
        with self.assertRaises(ft.Error):
            session.stats()
        session.close()  # twice is fine
        model.close()

    def test_close_from_another_thread_waits_for_a_call_in_progress(self):
        # The load is held in its progress callback while another thread closes the engine: the
        # close must wait for the load (the library is still using the engine), then close the
        # model the load made before freeing the engine.
        engine = self.engine()
        started, release, returned_after_release = threading.Event(), threading.Event(), []

        def progress(*_):
            if not started.is_set():
                started.set()
                release.wait(10)
            return True

        def close():
            started.wait(10)
            engine.close()
            returned_after_release.append(release.is_set())

        def release_later():
            started.wait(10)
            time.sleep(0.2)  # engine.close() has been called meanwhile
            release.set()
        threads = [threading.Thread(target=close), threading.Thread(target=release_later)]
        for t in threads:
            t.start()
        model = ft.Model.load(engine, self.ckpt, progress=progress)
        for t in threads:
            t.join(10)
        self.assertEqual(returned_after_release, [True])
        self.assertTrue(engine.closed and model.closed)

    def test_children_keep_their_parents_alive_and_gc_frees_everything(self):
        engine = self.engine()
        model = ft.Model.load(engine, self.ckpt)
        session = ft.Session(model, backend="cpu")
        probe = weakref.ref(engine)
        del engine, model
        gc.collect()
        self.assertIsNotNone(probe(), "the session must keep its model and engine alive")
        self.assertEqual(session.stats()["decode_calls"], 0)
        del session
        gc.collect()
        self.assertIsNone(probe())

    def test_many_handles_do_not_leak_or_crash(self):
        for _ in range(20):
            s = ft.Session(ft.Model.load(self.engine(), self.ckpt), backend="cpu")
            del s
        gc.collect()


class Callbacks(Checkpoint):
    def tearDown(self):
        ft.set_log_callback(None, "warn")

    def test_log_messages_reach_python(self):
        got = []
        ft.set_log_callback(lambda level, msg: got.append((level, msg)), "info")
        with self.engine() as engine, ft.Model.load(engine, self.ckpt):
            pass
        self.assertTrue(any("loading" in m for _, m in got), got)
        self.assertTrue(all(ft.FT_LOG_ERROR <= lvl <= ft.FT_LOG_INFO for lvl, _ in got))
        got.clear()
        ft.set_log_callback(lambda level, msg: got.append(msg), "off")
        with self.engine() as engine, ft.Model.load(engine, self.ckpt):
            pass
        self.assertEqual(got, [])
        with self.assertRaises(ValueError):
            ft.set_log_callback(print, "loud")

    def test_progress_reaches_python_and_can_cancel(self):
        calls = []
        with self.engine() as engine:
            with ft.Model.load(engine, self.ckpt, progress=lambda *a: calls.append(a)):
                pass
            self.assertTrue(calls)
            phase, done, total = calls[-1]
            self.assertEqual(phase, "load")
            self.assertEqual(done, total)
            self.assertGreater(total, 0)
            with self.assertRaises(ft.Error) as cm:
                ft.Model.load(engine, self.ckpt, progress=lambda phase, done, total: False)
            self.assertEqual(cm.exception.status, ft.FT_ERR_CANCELLED)

            def boom(phase, done, total):
                raise KeyError("from the callback")
            with self.assertRaises(KeyError):
                ft.Model.load(engine, self.ckpt, progress=boom)


if __name__ == "__main__":
    unittest.main()
