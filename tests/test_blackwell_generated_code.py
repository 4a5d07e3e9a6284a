"""What a close review of the Blackwell series asks of its generated code, checked in the PTX, the
SASS and the resource report of each version's representative build (and V6's 4-CTA one).

No Blackwell GPU is available here: these kernels are built for sm_100a and read, never run. Each
test names the fault it guards against; it fails when that fault is put back.
"""

import importlib.util
import re
import sys
import types

import pytest
import tilus
import torch
from conftest import representative_build

from matmul import build, protocol, tilus_fixes
from matmul.kernels import versions

ARCH = "sm_100a"
BLACKWELL = ("v0", "v1", "v2", "v3", "v4", "v5", "v6", "v8")
# one barrier instruction of any kind: the points a TMEM hand-off crosses between threads
BARRIER = re.compile(
    r"mbarrier\.try_wait|bar\.sync|bar\.cta\.sync|barrier\.sync|barrier\.cluster\.wait|"
    r"mbarrier\.arrive|barrier\.cluster\.arrive"
)


def built(version: str) -> build.BuildResult:
    result = representative_build(ARCH, version)
    assert result.ok, result.error[-3000:]
    return result


_four_cta = []


def four_cta() -> build.BuildResult:
    """V6 as a 4-CTA cluster (its FOUR_CTA configuration), built once per session."""
    if not _four_cta:
        module = versions.load(ARCH, "v6")
        _four_cta.append(build.build_config(module, ARCH, module.FOUR_CTA))
    assert _four_cta[0].ok, _four_cta[0].error[-3000:]
    return _four_cta[0]


def sass_of(result: build.BuildResult) -> str:
    if tilus_fixes.disassembler() is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install '.[sass]')")
    return result.sass()


def cuda_source(result: build.BuildResult) -> str:
    return (result.program_dir / "module" / "source.cu").read_text()


# -- V0: no local memory ---------------------------------------------------------------------------


def test_v0_epilogue_stays_out_of_local_memory():
    # reading the whole 128 x 128 fp32 accumulator at once put it in a 256-byte stack frame
    result = built("v0")
    assert result.stack_bytes == 0 and result.spill_bytes == 0
    assert "ld.local" not in result.ptx() and "st.local" not in result.ptx()
    sass = sass_of(result)
    assert "LDL" not in sass and "STL" not in sass


# -- V1-V4: the output staged block by block, 128-byte swizzled --------------------------------------


def output_tensor_map(result: build.BuildResult) -> tuple[list[int], str]:
    """The box ([columns, rows]) and swizzle of the tensor map the kernel stores C through."""
    source = cuda_source(result)
    call = re.search(
        r"cuTensorMapEncodeTiled\(\s*\(&(tma_tensor_map\w*)\),[^;]*?\(\w+\*\)\(c_ptr\)\),[^;]*?"
        r"CU_TENSOR_MAP_SWIZZLE_(\w+),",
        source,
    )
    assert call, "no tensor map over c_ptr"
    suffix = call.group(1)[len("tma_tensor_map") :]
    box = [int(x) for x in re.findall(rf"tma_box_shape{suffix}\[\d\] = uint32_t\((\d+)u\);", source)]
    return box, call.group(2)


@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_v1_to_v4_stage_the_output_in_swizzled_column_blocks(version):
    result = built(version)
    # one 64-column block of fp32 per thread at a time, not the 128 x 256 tile (254 registers)
    assert result.registers <= 128, result.registers
    assert result.spill_bytes == 0
    # each block is 128 bytes wide, staged 128-byte swizzled (stmatrix rows land in 8 different
    # bank groups) and stored by its own TMA store; a row-major 512-byte pitch would not swizzle
    box, swizzle = output_tensor_map(result)
    assert box == [64, 128] and swizzle == "128B", (box, swizzle)
    assert result.ptx().count("cp.async.bulk.tensor.2d.global.shared::cta") >= 1


# -- every version: the TMEM allocation permit, the TMEM fences --------------------------------------


@pytest.mark.parametrize("version", BLACKWELL)
def test_the_tmem_allocation_permit_is_relinquished_after_allocating(version):
    ptx = built(version).ptx()
    group = 2 if version == "v6" else 1
    alloc = ptx.index(f"tcgen05.alloc.cta_group::{group}")
    relinquish = ptx.find(f"tcgen05.relinquish_alloc_permit.cta_group::{group}.sync.aligned;")
    assert alloc < relinquish < ptx.index("tcgen05.mma"), "no relinquish between the allocation and the MMAs"


def fenced(ptx: str, at: int, fence: str, anchor: re.Pattern = BARRIER) -> bool:
    """Whether ``fence`` lies between the instruction at ``at`` and the nearest ``anchor`` before it."""
    anchors = [m.end() for m in anchor.finditer(ptx, 0, at)]
    return fence in ptx[anchors[-1] if anchors else 0 : at]


AFTER = "tcgen05.fence::after_thread_sync;"
BEFORE = "tcgen05.fence::before_thread_sync;"


@pytest.mark.parametrize("version", BLACKWELL)
def test_tmem_hand_offs_are_fenced(version):
    ptx = built(version).ptx()
    # the epilogue reads TMEM only after "after_thread_sync" follows its wait for the accumulator
    loads = [m.start() for m in re.finditer(r"tcgen05\.ld\.", ptx)]
    assert loads and all(fenced(ptx, at, AFTER, anchor=re.compile(r"mbarrier\.try_wait")) for at in loads)
    # TMEM is freed behind before_thread_sync -> barrier -> after_thread_sync
    dealloc = ptx.index("tcgen05.dealloc")
    assert fenced(ptx, dealloc, AFTER)
    barrier = [m for m in BARRIER.finditer(ptx, 0, dealloc)][-1]
    if barrier.group() == "barrier.cluster.wait":  # its arrive is the hand-off
        barrier = [m for m in BARRIER.finditer(ptx, 0, barrier.start())][-1]
    if version == "v8":  # split-K: the exchange's __syncthreads is the hand-off, then its DSMEM arrivals
        barrier = [m for m in re.compile(r"\bbar(\.cta)?\.sync").finditer(ptx, 0, dealloc)][-1]
    assert fenced(ptx, barrier.start(), BEFORE)
    if version in ("v5", "v6"):
        # a released accumulator buffer: before_thread_sync in front of the release, and the MMA
        # warp's wait for it followed by after_thread_sync (MMAs then overwrite that buffer)
        assert ptx.count(BEFORE) >= 2 and ptx.count(AFTER) >= 3


# -- V5, V6: a TMEM buffer goes back as soon as it is read; four staging buffers ---------------------


def releases_before_the_last_store(ptx: str) -> bool:
    """The epilogue's arrival that frees an accumulator buffer (the one behind before_thread_sync
    after a tcgen05.wait::ld) comes before the staging (stmatrix) and TMA store of a sub-tile that
    was read before it: the buffer is not held while its last sub-tile is stored."""
    for fence in re.finditer(re.escape(BEFORE), ptx):
        previous_ld = ptx.rfind("tcgen05.ld.", 0, fence.start())
        if previous_ld < 0 or "tcgen05.wait::ld" not in ptx[previous_ld : fence.start()]:
            continue
        if "stmatrix" in ptx[previous_ld : fence.start()]:
            continue  # this sub-tile was already staged: the release waited for it
        next_ld = ptx.find("tcgen05.ld.", fence.end())
        rest = ptx[fence.end() : next_ld if next_ld >= 0 else len(ptx)]
        if "mbarrier.arrive" in rest and "stmatrix" in rest and "cp.async.bulk.tensor.2d.global" in rest:
            return True
    return False


@pytest.mark.parametrize("version", ["v5", "v6"])
def test_a_tmem_buffer_is_released_before_its_last_sub_tile_is_stored(version):
    result = built(version)
    assert releases_before_the_last_store(result.ptx())
    # four staging buffers fit beside the representative's ring: three stores stay in flight
    assert "cp.async.bulk.wait_group.read 3;" in result.ptx()
    assert result.shared_bytes <= build.SHARED_MEMORY_LIMIT[ARCH]


# -- V6: CTA-scope rings ---------------------------------------------------------------------------


@pytest.mark.parametrize("cluster", ["2-CTA", "4-CTA"])
def test_v6_waits_and_arrives_at_cta_scope(cluster):
    ptx = (built("v6") if cluster == "2-CTA" else four_cta()).ptx()
    # every data hand-off completes by complete_tx, a tcgen05 commit or tcgen05.wait::ld + fence:
    # no wait acquires, and no arrival releases, at cluster scope
    assert "mbarrier.try_wait.parity.acquire.cta" in ptx
    assert not re.search(r"mbarrier\.try_wait[^;]*\.cluster", ptx)
    assert not re.search(r"mbarrier\.arrive[^;]*\.release\.cluster", ptx)
    # the arrivals still reach the leader's (and the CLC producer's) barriers in the peer CTA
    assert "mbarrier.arrive.expect_tx.release.cta.shared::cluster.b64" in ptx


def sass_ops(sass: str) -> list[str]:
    """The instructions of a SASS listing, one a line, without address and predicate."""
    return [
        re.sub(r"^@!?U?P\w+\s+", "", line.split("*/", 1)[1].split(";")[0].strip())
        for line in sass.splitlines()
        if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)
    ]


def l1_invalidations_outside_the_exit_path(sass: str) -> int:
    """CCTL.IVALL sites other than those after a cluster barrier wait (two per CTA lifetime) and
    after the final wait for the TMA stores (DEPBAR on the bulk-store scoreboard)."""
    ops = sass_ops(sass)
    count = 0
    for i, op in enumerate(ops):
        if op.startswith("CCTL.IVALL") and not (
            ops[i - 1].startswith("UCGABAR_WAIT") or ops[i - 1].startswith("DEPBAR.LE SB0, 0x0")
        ):
            count += 1
    return count


def test_v6_steady_state_has_no_l1_invalidation_or_gpu_membar():
    v5, v6 = sass_of(built("v5")), sass_of(built("v6"))
    # V5 invalidates L1 only when its last TMA stores are done; V6 adds the cluster barriers, and
    # nothing per K block or tile (cluster-scope rings put a CCTL.IVALL after every wait)
    assert l1_invalidations_outside_the_exit_path(v5) == 0
    assert l1_invalidations_outside_the_exit_path(v6) == 0
    assert v6.count("CCTL.IVALL") <= v5.count("CCTL.IVALL") + 2 * v6.count("UCGABAR_WAIT")
    # MEMBAR.ALL.GPU only as the release of a barrier.cluster.arrive
    ops = sass_ops(v6)
    membars = [i for i, op in enumerate(ops) if op.startswith("MEMBAR.ALL.GPU")]
    assert membars and all(any(op.startswith("UCGABAR_ARV") for op in ops[i : i + 4]) for i in membars)


# -- V6: the producer tail --------------------------------------------------------------------------


def v6_without(line: str, folder, monkeypatch) -> types.ModuleType:
    """A copy of V6 with one line of its source turned into ``pass`` (a planted bug), written to
    ``folder`` (tilus reads a kernel's source from its file)."""
    original = importlib.util.find_spec(versions.module_name(ARCH, "v6"))
    source = original.loader.get_source(original.name)
    assert source.count(line) == 1, line
    indent = line[: len(line) - len(line.lstrip())]
    path = folder / "v6_planted.py"
    path.write_text(source.replace(line, indent + "pass"))
    spec = importlib.util.spec_from_file_location(original.parent + ".v6_planted", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


TAIL = "            ring.producer_tail()  # the leaders' last commits still arrive on this CTA's empty barriers"


@pytest.mark.parametrize("cluster", ["REPRESENTATIVE", "FOUR_CTA"])
def test_v6_waits_for_the_last_commits_into_each_cta_before_it_exits(cluster, monkeypatch, tmp_path):
    # PTX promises that a commit arrives once the MMAs before it are complete, not that a thread's
    # commits arrive in the order it issued them: let the checker land them in any order
    module = versions.load(ARCH, "v6")
    config = getattr(module, cluster)
    report = protocol.check(ARCH, "v6", config=config, seeds=8, ordered_commits=False)
    assert report.finding is None, report.finding
    # without the producer tail a CTA may exit while a leader's multicast commit is on its way in
    planted = v6_without(TAIL, tmp_path, monkeypatch)
    report = protocol.check(ARCH, "v6", config=config, seeds=8, module=planted, ordered_commits=False)
    assert report.finding is not None and report.finding.kind == "exit", report.finding


# -- V6's 4-CTA cluster: built and checked, selectable, never tuned ---------------------------------


def test_the_four_cta_v6_is_selectable_but_not_in_the_autotune_space():
    module = versions.load(ARCH, "v6")
    assert module.FOUR_CTA["cluster_ctas"] == 4 and module.FOUR_CTA in module.EXTRA_CONFIGS
    assert all(config["cluster_ctas"] == 2 for config in versions.space(module))
    assert versions.kernel(module, torch.float16, module.FOUR_CTA) is not None  # a script fixed to it
    result = four_cta()
    assert result.cluster == (4, 1, 1) and result.spill_bytes == 0
    assert result.shared_bytes <= build.SHARED_MEMORY_LIMIT[ARCH]


# -- V8: the widened weight handed to the MMA through tensor memory --------------------------------


def test_v8_hands_each_widened_tile_over_after_its_store_landed_and_fenced():
    ptx = built("v8").ptx()
    stores = [m.start() for m in re.finditer(r"tcgen05\.st\.", ptx)]
    assert stores
    for at in stores:
        # the arrival that hands the buffer to the MMA warp comes after tcgen05.wait::st and the
        # before_thread_sync fence: the MMA must not read A before the store has landed in TMEM
        arrive = ptx.index("mbarrier.arrive", at)
        between = ptx[at:arrive]
        assert "tcgen05.wait::st" in between and BEFORE in between[between.index("tcgen05.wait::st") :]
    # every MMA, reading A from TMEM, follows after_thread_sync after its thread's last wait
    mmas = [m.start() for m in re.finditer(r"tcgen05\.mma\.", ptx)]
    assert mmas and all(fenced(ptx, at, AFTER, anchor=re.compile(r"mbarrier\.try_wait")) for at in mmas)


def test_v8_with_row_scales_widens_without_scaling_and_scales_the_sum():
    """``weight="int4_channel"``: the same widening of the integers into TMEM, but no 16-bit multiply
    by a group scale; no scales' box in a stage; the float32 row scales read once and multiplied into
    the drained accumulator (one float32 multiply a value of a thread's row)."""
    module = versions.load(ARCH, "v8")
    grouped = built("v8").ptx()
    result = build.build_config(module, ARCH, {**module.REPRESENTATIVE, "weight": "int4_channel"})
    assert result.ok, result.error[-3000:]
    ptx = result.ptx()
    assert ptx.count("lop3.b32") == grouped.count("lop3.b32") and ptx.count("tcgen05.st.") == grouped.count(
        "tcgen05.st."
    )
    assert "mul.f16" in grouped and "mul.f16" not in ptx
    assert "ld.global" not in grouped and "ld.global.nc.f32" in ptx
    assert ptx.count("mul.ftz.f32") == module.REPRESENTATIVE["block_m"]
    assert ptx.count("cp.async.bulk.tensor.2d") < grouped.count("cp.async.bulk.tensor.2d")


def test_v8_mma_with_a_in_tensor_memory_builds_only_with_the_fix(tmp_path):
    assert built("v8").ok
    module = versions.load(ARCH, "v8")
    previous = tilus.option.get_option("cache_dir")
    try:
        tilus.option.cache_dir(str(tmp_path))  # an empty cache: the build above must not hide the fault
        tilus.drivers.get_cache_dir.cache_clear()
        with tilus_fixes.disabled("tcgen05_tmem_a"):
            faulty = build.build_config(module, ARCH, module.REPRESENTATIVE)
    finally:
        tilus.option.cache_dir(previous)
        tilus.drivers.get_cache_dir.cache_clear()
    assert not faulty.ok and "Tcgen05MmaTSInst" in faulty.error


# -- the shared workspace (tcgen05.alloc's address) lies inside the requested shared memory ----------


def workspace_span(result: build.BuildResult) -> tuple[int, int]:
    """(offset of tilus's shared workspace, dynamic shared memory the launch asks for)."""
    offset = re.search(r"shared_workspace = tilus_cuda_dynamic_shared_memory_uint8\((\d+)\);", cuda_source(result))
    assert offset, "no shared workspace"
    return int(offset.group(1)), result.shared_bytes


@pytest.mark.parametrize("version", BLACKWELL)
def test_the_tmem_address_workspace_lies_inside_the_shared_memory(version):
    offset, shared = workspace_span(built(version))
    assert offset % 128 == 0 and offset + 4 <= shared, (offset, shared)


def test_the_workspace_is_sized_from_its_aligned_offset_only_with_the_fix():
    """tilus 0.2.0's allocator rounds every allocation up to 128 bytes, so the high-water mark
    that its finalize places the workspace above is aligned in every kernel it builds; tilus after
    0.2.0 placed barriers past an unaligned mark, and the arithmetic fault showed. The fault is
    shown here on tilus's own finalize, given such a mark."""
    from tilus.backends.contexts.smem_alloc_ctx import SharedMemoryAllocationContext

    def finalize_with_top(top: int) -> tuple[int, int]:
        context = SharedMemoryAllocationContext.__new__(SharedMemoryAllocationContext)
        context.__post_init__()
        attrs, prepended = {}, []
        context.codegen = types.SimpleNamespace(builder=types.SimpleNamespace(extend_attrs=attrs.update))
        context.kernel_prepend = prepended.append
        context.smem_allocator.maximum_allocated = top
        context.request_shared_workspace(nbytes=4)
        with build.target(ARCH):
            context.finalize()
        offset = int(re.search(r"shared_workspace\b.*dynamic_shared_memory\w*\((\d+)\)", str(prepended[0])).group(1))
        return offset, attrs["cuda.dynamic_smem_bytes"]

    assert tilus.__version__ == "0.2.0"
    offset, shared = finalize_with_top(1000)
    assert offset == 1024 and offset + 4 <= shared
    assert finalize_with_top(1024) == (1024, 1028)  # an aligned top is left as it was
    with tilus_fixes.disabled("workspace_in_shared_memory"):
        offset, shared = finalize_with_top(1000)
    assert offset == 1024 and shared == 1004  # the workspace ends 24 bytes past the shared memory
