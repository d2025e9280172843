"""Expert parallelism (freetoken_ep.h): EpGroup over the GPUs of an NCCL communicator.

Device arrays are checked like the session's (dtype, shape, contiguity, one CUDA device); streams are a
torch.cuda.Stream, a raw cudaStream_t (int) or None (torch's current stream of the group's device)."""
import ctypes

from . import _ffi
from ._arrays import ArrayError, as_buffer, same_device
from ._core import _ERR_SIZE, Error, _check, _cuda_stream_handle, _Handle, _set_fields, _sized
from ._ffi import load


def ep_params(**fields):
    """An ft_ep_params filled by ft_ep_params_init, then with `fields` set."""
    p = _ffi.ft_ep_params()
    load().ft_ep_params_init(ctypes.byref(p))
    _set_fields(p, fields, "ep_params")
    return p


class EpGroup(_Handle):
    """One rank of an expert-parallel group (ft_ep_group)."""
    _free_name, _error_name = "ft_ep_group_free", "ft_ep_group_last_error"
    _exclusive = True

    def __init__(self, ptr, params):
        super().__init__(ptr)
        self.params = params
        # The arrays of the latest dispatch or forward: the work it enqueued (and combine) reads them
        # on the stream after the call returns, so they stay referenced until the next one.
        self._keep = ()

    @classmethod
    def from_comm(cls, nccl_comm, device, **fields):
        """From an existing ncclComm_t (an int address, borrowed)."""
        p = ep_params(**fields)
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        _check(load().ft_ep_group_create_from_comm(nccl_comm, device, ctypes.byref(p), ctypes.byref(out), err,
                                                   len(err)), "ft_ep_group_create_from_comm", err_buffer=err)
        return cls(out.value, p)

    @classmethod
    def bootstrap(cls, nranks, rank, device, broadcast=None, **fields):
        """Rank `rank` of `nranks` with a communicator of its own. broadcast(data: bytes, rank) -> bytes
        carries rank 0's id to every rank (rank 0 gets its own bytes back); None: NCCL_COMM_ID."""
        p = ep_params(**fields)
        error = []

        def call(data, nbytes, _user):
            try:
                mine = ctypes.string_at(data, nbytes)
                got = broadcast(mine, rank)
                if len(got) != nbytes:
                    raise ValueError("broadcast returned %d bytes, expected %d" % (len(got), nbytes))
                ctypes.memmove(data, got, nbytes)
                return 0
            except BaseException as e:  # noqa: B902
                error.append(e)
                return 1
        thunk = _ffi.ft_ep_broadcast_fn(call) if broadcast is not None else _ffi.ft_ep_broadcast_fn()
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_SIZE)
        status = load().ft_ep_group_bootstrap(nranks, rank, device, thunk, None, ctypes.byref(p), ctypes.byref(out),
                                              err, len(err))
        if error:
            raise error[0]
        _check(status, "ft_ep_group_bootstrap", err_buffer=err)
        return cls(out.value, p)

    @classmethod
    def bootstrap_local(cls, devices, **fields):
        """One group per listed device of this process; returns a list (each needs its own host thread)."""
        p = ep_params(**fields)
        n = len(devices)
        devs = (ctypes.c_int32 * n)(*devices)
        outs = (ctypes.c_void_p * n)()
        err = ctypes.create_string_buffer(_ERR_SIZE)
        _check(load().ft_ep_group_bootstrap_local(n, devs, ctypes.byref(p), outs, err, len(err)),
               "ft_ep_group_bootstrap_local", err_buffer=err)
        return [cls(outs[i], p) for i in range(n)]

    def info(self):
        return self._read(_ffi.ft_ep_group_info, "ft_ep_group_info_get")

    def set_placement(self, phy2log):
        """phy2log: a sequence of ranks * slots_per_rank logical expert ids."""
        vals = [int(v) for v in phy2log]
        arr = (ctypes.c_int32 * len(vals))(*vals)
        self._call("ft_ep_group_set_placement", arr, ctypes.c_size_t(len(vals)))

    def get_placement(self):
        count = ctypes.c_size_t(0)
        self._call("ft_ep_group_get_placement", None, 0, ctypes.byref(count))
        arr = (ctypes.c_int32 * max(1, count.value))()
        self._call("ft_ep_group_get_placement", arr, count.value, ctypes.byref(count))
        return list(arr[:count.value])

    def _inputs(self, topk_ids, topk_weights, x):
        H, K = self.params.hidden, self.params.top_k
        xb = as_buffer(x, "bf16", "x", (None, H))
        T = xb.shape[0]
        ids = as_buffer(topk_ids, "i32", "topk_ids", (T, K))
        bufs = [("x", xb), ("topk_ids", ids)]
        w = None
        if topk_weights is not None:
            w = as_buffer(topk_weights, "f32", "topk_weights", (T, K))
            bufs.append(("topk_weights", w))
        dev = same_device(bufs)
        if dev == "cpu":
            raise ArrayError("expert parallelism takes CUDA device arrays")
        return xb, ids, w, T, dev

    def dispatch(self, topk_ids, topk_weights, x, stream=None):
        """Returns the ft_ep_expert_batch of the rows this rank's experts compute before combine()."""
        xb, ids, w, T, dev = self._inputs(topk_ids, topk_weights, x)
        batch = _sized(_ffi.ft_ep_expert_batch)
        self._keep = (topk_ids, topk_weights, x)
        self._call("ft_ep_dispatch", ids.ptr, w.ptr if w else None, xb.ptr, T, _cuda_stream_handle(stream, dev),
                   ctypes.byref(batch))
        return batch

    def combine(self, out, stream=None):
        y = as_buffer(out, "bf16", "out", (None, self.params.hidden), writable=True)
        if y.device == "cpu":
            raise ArrayError("out: must be CUDA device memory")
        self._call("ft_ep_combine", y.ptr, _cuda_stream_handle(stream, y.device))
        return out

    def forward(self, topk_ids, topk_weights, x, expert, out, stream=None):
        """Dispatch, expert(batch: ft_ep_expert_batch, stream: int) and combine in one call. `expert` must
        enqueue work on the stream and not raise (peers wait on this rank); an exception is re-raised
        after the collective returns."""
        xb, ids, w, T, dev = self._inputs(topk_ids, topk_weights, x)
        y = as_buffer(out, "bf16", "out", (T, self.params.hidden), writable=True)
        same_device([("x", xb), ("out", y)])
        error = []

        def call(batch, s, _user):
            try:
                expert(batch.contents, s or 0)
            except BaseException as e:  # noqa: B902
                error.append(e)
        thunk = _ffi.ft_ep_expert_fn(call)
        self._keep = (topk_ids, topk_weights, x, out)
        with self._use() as h:
            status = load().ft_ep_forward(h, ids.ptr, w.ptr if w else None, xb.ptr, T, thunk, None, y.ptr,
                                          _cuda_stream_handle(stream, dev))
            if error:
                raise error[0]
            self._check(status, "ft_ep_forward")
        return out

    def forward_session(self, session, layer, topk_ids, topk_weights, x, out, stream=None):
        """ft_ep_forward_session: this rank's experts computed by a FreeToken session on the group's GPU."""
        xb, ids, w, T, dev = self._inputs(topk_ids, topk_weights, x)
        y = as_buffer(out, "bf16", "out", (T, self.params.hidden), writable=True)
        same_device([("x", xb), ("out", y)])
        self._keep = (topk_ids, topk_weights, x, out)
        # The group first, then the session, as in forward() whose expert callback may use a session.
        with self._use() as g, session._use() as sh, session.model._use() as mh:
            self._check(load().ft_ep_forward_session(g, sh, mh, session.max_tokens, layer, ids.ptr,
                                                     w.ptr if w else None, xb.ptr, T, y.ptr,
                                                     _cuda_stream_handle(stream, dev)), "ft_ep_forward_session")
        return out


__all__ = ["EpGroup", "ep_params", "Error"]
