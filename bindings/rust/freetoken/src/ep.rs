//! Expert parallelism across GPUs through NCCL (`freetoken_ep.h`).
//!
//! An [`EpGroup`] is one rank (one GPU) of a group that splits a MoE layer's routed experts
//! across GPUs. Creating one needs a CUDA build of the library and NCCL at run time
//! (`libnccl.so.2`); elsewhere every creation returns [`Status::UNSUPPORTED`]. The per-layer
//! calls take device pointers and a CUDA stream, so they are `unsafe`.

use std::any::Any;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use crate::sys;
use crate::error::{Error, Result, Status};
use crate::util::{check, defaults, sized, string_of, to_i32, with_err_buf};
use crate::bf16::Bf16;
use crate::model::Model;
use crate::session::Session;

int_enum!(
    /// Group modes (`FT_EP_MODE_*`).
    EpMode { THROUGHPUT = sys::FT_EP_MODE_THROUGHPUT, LATENCY = sys::FT_EP_MODE_LATENCY }
);
int_enum!(
    /// Wire formats of dispatch and combine (`FT_EP_WIRE_*`).
    EpWire { BF16 = sys::FT_EP_WIRE_BF16, FP8 = sys::FT_EP_WIRE_FP8, FP8_UE8M0 = sys::FT_EP_WIRE_FP8_UE8M0 }
);

/// Group parameters; `default()` holds the library's defaults (num_experts, hidden and
/// max_tokens must be set).
#[derive(Clone, Debug)]
pub struct EpParams {
    pub num_experts: i32,
    pub slots_per_rank: i32,
    pub top_k: i32,
    pub hidden: i64,
    pub max_tokens: i64,
    pub mode: EpMode,
    pub wire: EpWire,
    pub chunks: i32,
    pub nccl_max_ctas: i32,
    pub link_bytes_per_s: f64,
    pub max_expert_rows: i64,
    pub combine_wire: EpWire,
    pub combine_max_rel_error: f32,
}

impl Default for EpParams {
    fn default() -> EpParams {
        let p = defaults(sys::ft_ep_params_init);
        EpParams {
            num_experts: p.num_experts,
            slots_per_rank: p.slots_per_rank,
            top_k: p.top_k,
            hidden: p.hidden,
            max_tokens: p.max_tokens,
            mode: EpMode(p.mode),
            wire: EpWire(p.wire),
            chunks: p.chunks,
            nccl_max_ctas: p.nccl_max_ctas,
            link_bytes_per_s: p.link_bytes_per_s,
            max_expert_rows: p.max_expert_rows,
            combine_wire: EpWire(p.combine_wire),
            combine_max_rel_error: p.combine_max_rel_error,
        }
    }
}

impl EpParams {
    fn raw(&self) -> sys::ft_ep_params {
        let mut p = defaults(sys::ft_ep_params_init);
        p.num_experts = self.num_experts;
        p.slots_per_rank = self.slots_per_rank;
        p.top_k = self.top_k;
        p.hidden = self.hidden;
        p.max_tokens = self.max_tokens;
        p.mode = self.mode.0;
        p.wire = self.wire.0;
        p.chunks = self.chunks;
        p.nccl_max_ctas = self.nccl_max_ctas;
        p.link_bytes_per_s = self.link_bytes_per_s;
        p.max_expert_rows = self.max_expert_rows;
        p.combine_wire = self.combine_wire.0;
        p.combine_max_rel_error = self.combine_max_rel_error;
        p
    }
}

/// A group's rank, topology and last-call figures (`ft_ep_group_info_get`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EpGroupInfo {
    pub rank: i32,
    pub ranks: i32,
    pub slots_per_rank: i32,
    pub device: i32,
    pub nccl_version: i32,
    pub last_chunks: i32,
    pub last_bytes_sent: u64,
    pub pci_bus_id: String,
    pub numa_node: i32,
    pub pcie_link_width: i32,
    pub pcie_link_gts: f64,
    pub link_bytes_per_s: f64,
    pub calibrated_bytes_per_s: f64,
    pub p2p_known: u64,
    pub p2p_mask: u64,
    pub combine_wire: EpWire,
    pub combine_last_rel_error: f32,
}

/// The rows this rank's experts must process: device pointers owned by the group, valid until
/// the next call on it (the borrow of the group).
#[derive(Clone, Copy)]
pub struct ExpertBatch<'g> {
    raw: sys::ft_ep_expert_batch,
    _group: PhantomData<&'g ()>,
}

impl<'g> ExpertBatch<'g> {
    /// The C struct (device pointers: offset \[slots + 1\], x and y \[max_rows, hidden\] bf16,
    /// row_source, row_token, row_weight \[max_rows\]).
    pub fn raw(&self) -> &sys::ft_ep_expert_batch {
        &self.raw
    }
    pub fn slots(&self) -> i32 {
        self.raw.slots
    }
    pub fn hidden(&self) -> i64 {
        self.raw.hidden
    }
    pub fn max_rows(&self) -> i64 {
        self.raw.max_rows
    }
}

/// One rank of an expert-parallel group. Used by one host thread at a time (`Send`, not `Sync`;
/// the calls take `&mut self`).
///
/// ```no_run
/// use freetoken::ep::{EpGroup, EpParams};
/// use freetoken::Status;
/// let params = EpParams { num_experts: 8, hidden: 1024, max_tokens: 64, ..Default::default() };
/// match EpGroup::bootstrap_local(&[0, 1], &params) {
///     Ok(groups) => println!("{} ranks", groups[0].info()?.ranks),
///     Err(e) if e.status() == Status::UNSUPPORTED => println!("no CUDA or NCCL here: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), freetoken::Error>(())
/// ```
pub struct EpGroup {
    raw: NonNull<sys::ft_ep_group>,
}

// SAFETY: the header's threading contract: a group is used by one host thread at a time.
unsafe impl Send for EpGroup {}

/// Carries rank 0's bytes to this rank (the buffer holds them on return); false on failure.
pub type BroadcastFn<'a> = &'a mut (dyn FnMut(&mut [u8]) -> bool + Send);

struct Broadcast<'a> {
    f: BroadcastFn<'a>,
    panic: Option<Box<dyn Any + Send>>,
}

type BroadcastTrampoline = unsafe extern "C" fn(*mut c_void, usize, *mut c_void) -> i32;

unsafe extern "C" fn broadcast_trampoline(data: *mut c_void, bytes: usize, user: *mut c_void) -> i32 {
    let b = &mut *(user as *mut Broadcast);
    let buf: &mut [u8] = if bytes == 0 { &mut [] } else { std::slice::from_raw_parts_mut(data as *mut u8, bytes) };
    match catch_unwind(AssertUnwindSafe(|| (b.f)(buf))) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            b.panic = Some(e);
            1
        }
    }
}

struct Experts<'a> {
    f: &'a mut dyn FnMut(&ExpertBatch<'_>, *mut c_void),
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn experts_trampoline(batch: *const sys::ft_ep_expert_batch, stream: *mut c_void, user: *mut c_void) {
    let x = &mut *(user as *mut Experts);
    if batch.is_null() || x.panic.is_some() {
        return;
    }
    let b = ExpertBatch { raw: *batch, _group: PhantomData };
    if let Err(e) = catch_unwind(AssertUnwindSafe(|| (x.f)(&b, stream))) {
        x.panic = Some(e);
    }
}

impl EpGroup {
    fn from_raw(raw: *mut sys::ft_ep_group) -> Result<EpGroup> {
        Ok(EpGroup { raw: NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "EP creation gave NULL"))? })
    }

    /// A group on `device` over an existing NCCL communicator (`ft_ep_group_create_from_comm`).
    ///
    /// # Safety
    /// `nccl_comm` must be a valid `ncclComm_t` that outlives the group.
    pub unsafe fn from_comm(nccl_comm: *mut c_void, device: i32, params: &EpParams) -> Result<EpGroup> {
        let p = params.raw();
        let mut raw = ptr::null_mut();
        with_err_buf(|err, n| sys::ft_ep_group_create_from_comm(nccl_comm, device, &p, &mut raw, err, n))?;
        EpGroup::from_raw(raw)
    }

    /// Rank `rank` of `nranks` on `device` with a communicator of its own
    /// (`ft_ep_group_bootstrap`). `broadcast` carries rank 0's bytes to every rank (called once on
    /// every rank; return false on failure); None: NCCL_COMM_ID must be set on every rank.
    /// Blocks until all ranks joined.
    pub fn bootstrap(
        nranks: i32,
        rank: i32,
        device: i32,
        broadcast: Option<BroadcastFn<'_>>,
        params: &EpParams,
    ) -> Result<EpGroup> {
        let p = params.raw();
        let mut raw = ptr::null_mut();
        let mut b = broadcast.map(|f| Broadcast { f, panic: None });
        let (cb, user) = match &mut b {
            Some(b) => (Some(broadcast_trampoline as BroadcastTrampoline), b as *mut Broadcast as *mut c_void),
            None => (None, ptr::null_mut()),
        };
        let r = with_err_buf(|err, n| unsafe {
            sys::ft_ep_group_bootstrap(nranks, rank, device, cb, user, &p, &mut raw, err, n)
        });
        if let Some(Broadcast { panic: Some(e), .. }) = b {
            resume_unwind(e);
        }
        r?;
        EpGroup::from_raw(raw)
    }

    /// One group per listed device of this process; element i is rank i
    /// (`ft_ep_group_bootstrap_local`). Each needs its own host thread afterwards.
    pub fn bootstrap_local(devices: &[i32], params: &EpParams) -> Result<Vec<EpGroup>> {
        let p = params.raw();
        let ndevices = to_i32(devices.len(), "devices")?;
        let mut raw = vec![ptr::null_mut(); devices.len()];
        with_err_buf(|err, n| unsafe {
            sys::ft_ep_group_bootstrap_local(
                ndevices,
                devices.as_ptr(),
                &p,
                raw.as_mut_ptr(),
                err,
                n,
            )
        })?;
        raw.into_iter().map(EpGroup::from_raw).collect()
    }

    fn check(&self, status: sys::ft_status) -> Result<()> {
        check(status, || unsafe { string_of(sys::ft_ep_group_last_error(self.raw.as_ptr())) })
    }

    pub fn info(&self) -> Result<EpGroupInfo> {
        let mut i: sys::ft_ep_group_info = sized();
        let s = unsafe { sys::ft_ep_group_info_get(self.raw.as_ptr(), &mut i) };
        self.check(s)?;
        let bus: Vec<u8> = i.pci_bus_id.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        Ok(EpGroupInfo {
            rank: i.rank,
            ranks: i.ranks,
            slots_per_rank: i.slots_per_rank,
            device: i.device,
            nccl_version: i.nccl_version,
            last_chunks: i.last_chunks,
            last_bytes_sent: i.last_bytes_sent,
            pci_bus_id: String::from_utf8_lossy(&bus).into_owned(),
            numa_node: i.numa_node,
            pcie_link_width: i.pcie_link_width,
            pcie_link_gts: i.pcie_link_gts,
            link_bytes_per_s: i.link_bytes_per_s,
            calibrated_bytes_per_s: i.calibrated_bytes_per_s,
            p2p_known: i.p2p_known,
            p2p_mask: i.p2p_mask,
            combine_wire: EpWire(i.combine_wire),
            combine_last_rel_error: i.combine_last_rel_error,
        })
    }

    /// Sets the expert placement: `phy2log[r * slots_per_rank + s]` is the logical expert in slot
    /// s of rank r (ranks * slots_per_rank entries).
    pub fn set_placement(&mut self, phy2log: &[i32]) -> Result<()> {
        let s = unsafe { sys::ft_ep_group_set_placement(self.raw.as_ptr(), phy2log.as_ptr(), phy2log.len()) };
        self.check(s)
    }

    /// The expert placement (ranks * slots_per_rank entries).
    pub fn placement(&self) -> Result<Vec<i32>> {
        let mut count = 0usize;
        let s = unsafe { sys::ft_ep_group_get_placement(self.raw.as_ptr(), ptr::null_mut(), 0, &mut count) };
        self.check(s)?;
        let mut v = vec![0i32; count];
        let s = unsafe { sys::ft_ep_group_get_placement(self.raw.as_ptr(), v.as_mut_ptr(), v.len(), &mut count) };
        self.check(s)?;
        v.truncate(count);
        Ok(v)
    }

    /// Sends this rank's tokens to the ranks that hold their experts (`ft_ep_dispatch`); the
    /// returned batch describes the rows to compute on `stream` before [`combine`](Self::combine).
    ///
    /// # Safety
    /// `topk_ids`, `topk_weights` (or null) [tokens, top_k] and `x` [tokens, hidden] bf16 must be
    /// device memory of the group's GPU; `stream` a valid `cudaStream_t` of it or null.
    pub unsafe fn dispatch(
        &mut self,
        topk_ids: *const i32,
        topk_weights: *const f32,
        x: *const Bf16,
        tokens: i64,
        stream: *mut c_void,
    ) -> Result<ExpertBatch<'_>> {
        let mut b: sys::ft_ep_expert_batch = sized();
        let s = sys::ft_ep_dispatch(self.raw.as_ptr(), topk_ids, topk_weights, x as *const u16, tokens, stream, &mut b);
        self.check(s)?;
        Ok(ExpertBatch { raw: b, _group: PhantomData })
    }

    /// Returns the computed rows and sums each token's routes into `out` (`ft_ep_combine`).
    ///
    /// # Safety
    /// `out` [tokens, hidden] bf16 device memory of the group's GPU; `stream` as for dispatch.
    pub unsafe fn combine(&mut self, out: *mut Bf16, stream: *mut c_void) -> Result<()> {
        let s = sys::ft_ep_combine(self.raw.as_ptr(), out as *mut u16, stream);
        self.check(s)
    }

    /// Dispatch, the caller's experts and combine in one call (`ft_ep_forward`). `expert` enqueues
    /// the experts of a batch on the given stream; it must not synchronise or fail (a panic is
    /// held until the call returns, then resumed).
    ///
    /// # Safety
    /// As [`dispatch`](Self::dispatch) and [`combine`](Self::combine).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn forward(
        &mut self,
        topk_ids: *const i32,
        topk_weights: *const f32,
        x: *const Bf16,
        tokens: i64,
        expert: &mut dyn FnMut(&ExpertBatch<'_>, *mut c_void),
        out: *mut Bf16,
        stream: *mut c_void,
    ) -> Result<()> {
        let mut ctx = Experts { f: expert, panic: None };
        let s = sys::ft_ep_forward(
            self.raw.as_ptr(),
            topk_ids,
            topk_weights,
            x as *const u16,
            tokens,
            Some(experts_trampoline),
            &mut ctx as *mut Experts as *mut c_void,
            out as *mut u16,
            stream,
        );
        if let Some(e) = ctx.panic.take() {
            resume_unwind(e);
        }
        self.check(s)
    }

    /// `ft_ep_forward` with this rank's experts computed by `session` on `model`
    /// (`ft_ep_forward_session`).
    ///
    /// # Safety
    /// As [`forward`](Self::forward); `session` runs on the group's GPU.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn forward_session(
        &mut self,
        session: &mut Session<'_>,
        model: &Model<'_>,
        session_max_tokens: i32,
        layer: i32,
        topk_ids: *const i32,
        topk_weights: *const f32,
        x: *const Bf16,
        tokens: i64,
        out: *mut Bf16,
        stream: *mut c_void,
    ) -> Result<()> {
        let s = sys::ft_ep_forward_session(
            self.raw.as_ptr(),
            session.as_ptr(),
            model.as_ptr(),
            session_max_tokens,
            layer,
            topk_ids,
            topk_weights,
            x as *const u16,
            tokens,
            out as *mut u16,
            stream,
        );
        self.check(s)
    }
}

impl Drop for EpGroup {
    fn drop(&mut self) {
        unsafe { sys::ft_ep_group_free(self.raw.as_ptr()) }
    }
}
