"""Each tilus 0.2.0 work-around is needed: taking it out brings the fault back."""

import re
import subprocess

import pytest
import tilus
import tilus.drivers
import torch
from tilus import int4b, int32, void_p
from tilus.ir.layout.ops.register_ops import local, spatial

from matmul import build, tilus_fixes
from matmul.kernels import versions
from matmul.tilus_fixes import atomic_library


@pytest.fixture
def fresh_cache(tmp_path):
    """Each build in the test goes to an empty cache, so that nothing built before hides a fault."""
    previous = tilus.option.get_option("cache_dir")
    yield tmp_path
    tilus.option.cache_dir(previous)
    tilus.drivers.get_cache_dir.cache_clear()


_builds = iter(range(10**6))


def use_cache(path) -> None:
    tilus.option.cache_dir(str(path))
    tilus.drivers.get_cache_dir.cache_clear()  # tilus memoizes program -> cache folder


def build_hopper_tma_kernel(config=None):
    config = config or dict(block_m=64, block_n=128, block_k=32)
    use_cache(tilus.option.get_option("cache_dir") + f"/fresh{next(_builds)}")
    return build.build_config(versions.load("sm_90a", "v1"), "sm_90a", config)


def result_lib(result):
    return result.program_dir / "module" / "lib.so"


def test_fixes_are_applied_for_tilus_0_2_0():
    assert tilus.__version__ == "0.2.0"
    assert set(tilus_fixes.FIXES) == {
        "tma_sm90",
        "build_without_gpu",
        "atomic_library",
        "keep_ptx",
        "serial_transpile",
        "serial_instantiation",
        "fence_tall_accumulators",
        "workspace_in_shared_memory",
        "mn_major_operands",
        "wgmma_register_a",
        "int4_bf16_cast",
        "tcgen05_tmem_a",
        "wgmma_instruction_width",
        "wgmma_descriptor_offsets",
        "wgmma_uniform_descriptors",
    }
    assert all(fix.applied for fix in tilus_fixes.FIXES.values())


def test_tma_load_builds_for_sm90a_only_with_the_fix(fresh_cache):
    tilus.option.cache_dir(str(fresh_cache))
    assert build_hopper_tma_kernel().ok
    with tilus_fixes.disabled("tma_sm90"):
        result = build_hopper_tma_kernel()
    assert not result.ok
    assert "cta_group" in result.error and "sm_90a" in result.error


def test_blackwell_keeps_cta_group_qualifier(fresh_cache):
    tilus.option.cache_dir(str(fresh_cache))
    module = versions.load("sm_100a", "v1")
    result = build.build_config(module, "sm_100a", module.REPRESENTATIVE)
    assert result.ok and ".cta_group::1" in result.ptx()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fault shows only on a machine without a GPU")
def test_build_without_gpu_needs_the_fix(fresh_cache):
    tilus.option.cache_dir(str(fresh_cache))
    assert build_hopper_tma_kernel().ok
    assert tilus_fixes.stand_in_libcuda_dir() is not None  # no driver here: linked against the stand-in
    # ...which keeps the library loadable on a GPU machine: it still asks for the driver by soname
    dynamic = subprocess.run(
        ["readelf", "-d", str(result_lib(build_hopper_tma_kernel()))], capture_output=True, text=True
    ).stdout
    assert "[libcuda.so.1]" in dynamic
    with tilus_fixes.disabled("build_without_gpu"):
        result = build_hopper_tma_kernel()
    assert not result.ok and "CUDA is not available" in result.error


def test_a_library_appears_only_whole_with_the_fix(tmp_path):
    """``atomic_library``: while the compiler writes a kernel's library, ``lib.so`` must not exist
    (another process would find the program built and load it half written); once written, it is
    there whole; a failed compile leaves nothing. The compiler here is a stand-in that writes the
    library in two parts and looks at ``lib.so`` in between."""
    library = tmp_path / "module" / "lib.so"
    library.parent.mkdir()
    seen = []

    def compiler(source_file, output_library_file, target, *rest):
        with open(output_library_file, "wb") as f:
            f.write(b"first half;")
            f.flush()
            seen.append(library.exists())
            f.write(b"second half")
        if target == "fail":
            raise RuntimeError("nvcc failed")

    def compile_with_the_fix(target):
        atomic_library._compile_then_rename(compiler)("source.cu", str(library), target)

    # tilus's build calls the fix's wrapper (its code, around the compile of the fixes before it)
    assert tilus.drivers.compile_source.__code__ is atomic_library._compile_then_rename(print).__code__
    compile_with_the_fix("sm_90a")
    assert seen == [False] and library.read_bytes() == b"first half;second half"
    library.unlink()
    with pytest.raises(RuntimeError, match="nvcc failed"):
        compile_with_the_fix("fail")
    assert list(library.parent.iterdir()) == []  # no lib.so, no partial file
    seen.clear()
    compiler("source.cu", str(library), "sm_90a")  # tilus's own way: lib.so exists half written
    assert seen == [True]


def test_ptx_is_kept_only_with_the_fix(fresh_cache):
    tilus.option.cache_dir(str(fresh_cache))
    result = build_hopper_tma_kernel()
    assert result.ptx_path.exists() and "wgmma.mma_async" in result.ptx()
    with tilus_fixes.disabled("keep_ptx"):
        result = build_hopper_tma_kernel()
    assert result.ok and not result.ptx_path.exists()


def build_through_tilus_autotuning(version: str):
    """Transpile a version's whole space the way tilus does before it autotunes, then build the first
    configuration; the error, or None."""
    module = versions.load("sm_90a", version)
    args = (4096, 4096, 4096, None, None, None, 4096, 4096, 4096, None)  # pointers play no part in transpiling
    with build.target("sm_90a"):
        instance = versions.kernel(module, torch.float16)._jit_instance_for(*args)
        versions.kernel(module, torch.float16).jit_instances.clear()  # the next call transpiles anew
        try:
            tilus.drivers.build_program(instance.transpiled_programs[0], tilus.drivers.BuildOptions.create())
        except Exception as e:
            return e
    return None


def test_autotune_space_transpiled_in_workers_builds_only_with_the_fix(fresh_cache):
    tilus.option.cache_dir(str(fresh_cache))
    assert build_through_tilus_autotuning("v2") is None
    with tilus_fixes.disabled("serial_transpile"):
        use_cache(fresh_cache / "without")
        error = build_through_tilus_autotuning("v2")
    assert isinstance(error, AssertionError)


def ptxas_report(result) -> str:
    return (result.program_dir / "module" / "nvcc_output.txt").read_text()


def build_with_and_without(fix: str, module, config, cache):
    """The configuration built with the fix and without it, each into its own empty cache."""
    use_cache(cache / "with")
    fixed = build.build_config(module, "sm_90a", config)
    with tilus_fixes.disabled(fix):
        use_cache(cache / "without")
        unfixed = build.build_config(module, "sm_90a", config)
    return fixed, unfixed


def test_a_128_row_accumulator_keeps_its_wgmma_in_flight_only_with_the_fix(fresh_cache):
    # Hopper V2 with a 128 x 128 tile: one warpgroup, two rows of wgmma instructions
    fixed, faulty = build_with_and_without(
        "fence_tall_accumulators",
        versions.load("sm_90a", "v2"),
        dict(block_m=128, block_n=128, block_k=64, stages=2),
        fresh_cache,
    )
    assert fixed.ok and not re.search(r"C75\d\d|serialized", ptxas_report(fixed)), ptxas_report(fixed)
    # without it ptxas injects a warpgroup.arrive (C7519) and a warpgroup.wait (C7517): the wgmma
    # group V2 keeps in flight is waited for at once
    assert faulty.ok and "C7517" in ptxas_report(faulty) and "C7519" in ptxas_report(faulty)


def test_one_row_accumulators_are_left_as_they_were(fresh_cache):
    module = versions.load("sm_90a", "v5")  # two warpgroups, 64 x 256 each
    results = build_with_and_without("fence_tall_accumulators", module, module.REPRESENTATIVE, fresh_cache)
    cuda_source = [(result.program_dir / "module" / "source.cu").read_text() for result in results]
    assert cuda_source[0] == cuda_source[1] and "wgmma_fence_operand" not in cuda_source[0]


def build_kn_with_and_without(arch: str, cache):
    """V3's "kn" variant (B's tiles MN-major) built with the fix and without it, each into its own cache."""
    from test_b_layout import build_kn

    use_cache(cache / "with")
    fixed = build_kn(arch, "v3")
    with tilus_fixes.disabled("mn_major_operands"):
        use_cache(cache / "without")
        unfixed = build_kn(arch, "v3")
    return fixed, unfixed


def test_wgmma_reads_an_mn_major_b_only_with_the_fix(fresh_cache):
    from test_b_layout import DESCRIPTOR, check_reads_weight_mn_major, wgmma_transpose_flags

    fixed, faulty = build_kn_with_and_without("sm_90a", fresh_cache)
    check_reads_weight_mn_major(fixed, "sm_90a", "v3")  # trans-b 1, the descriptor strides over 64-column boxes
    # without it the build succeeds and is wrong: layout inference gives the wgmma's view of the
    # tiles the wgmma rule's K-major guess (TMA still writes them MN-major), and trans-b is 0
    assert faulty.ok and wgmma_transpose_flags(faulty.ptx()) == {(0, 0)}
    source = (faulty.program_dir / "module" / "source.cu").read_text()
    assert (8192, 1024) not in {(int(lbo) * 16, int(sbo) * 16) for lbo, sbo in DESCRIPTOR.findall(source)}


def test_tcgen05_takes_a_k_major_a_beside_an_mn_major_b_only_with_the_fix(fresh_cache):
    from test_b_layout import check_reads_weight_mn_major

    fixed, faulty = build_kn_with_and_without("sm_100a", fresh_cache)
    check_reads_weight_mn_major(fixed, "sm_100a", "v3")  # the instruction descriptor's transpose-B bit
    assert not faulty.ok and "majorness is not supported: K and MN" in faulty.error


def test_wgmma_with_a_in_registers_builds_only_with_the_fix(fresh_cache):
    from conftest import representative_build

    assert representative_build("sm_90a", "v8").ok  # Hopper V8: its int4 weight widened into A's registers
    module = versions.load("sm_90a", "v8")
    with tilus_fixes.disabled("wgmma_register_a"):
        use_cache(fresh_cache / "without")
        faulty = build.build_config(module, "sm_90a", module.REPRESENTATIVE)
    assert not faulty.ok and "WgmmaMmaRS" in faulty.error


# a thread's 4 int32 words, seen as its 32 int4 values (V8 widens its own pairs, pipeline.widen)
CAST_WORDS = spatial(128, 1) * local(1, 4)
CAST_VALUES = spatial(128, 1) * local(1, 32)


class Int4Cast(tilus.Script):
    """128 x 32 int4 values (4 words a thread) cast by tilus to ``dtype`` and stored."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def __call__(self, words_ptr: void_p, out_ptr: void_p):
        self.attrs.blocks = 1
        self.attrs.warps = 4
        g_words = self.global_view(words_ptr, dtype=int32, shape=[128, 4])
        g_out = self.global_view(out_ptr, dtype=self.dtype, shape=[128, 32])
        words = self.load_global(g_words, offsets=[0, 0], shape=[128, 4])
        self.annotate_layout(words, CAST_WORDS)
        values = self.view(words, layout=CAST_VALUES, dtype=int4b)
        wide = values.to(self.dtype)
        self.annotate_layout(wide, CAST_VALUES)
        self.store_global(g_out, wide, offsets=[0, 0])


def test_int4_widens_to_bfloat16_eight_values_at_a_time_only_with_the_fix(fresh_cache):
    use_cache(fresh_cache / "with")
    fixed = build.build_script(Int4Cast, "sm_90a", {"dtype": tilus.bfloat16}, version="int4_cast")
    with tilus_fixes.disabled("int4_bf16_cast"):
        use_cache(fresh_cache / "without")
        slow = build.build_script(Int4Cast, "sm_90a", {"dtype": tilus.bfloat16}, version="int4_cast")
    assert fixed.ok and slow.ok, fixed.error + slow.error
    magic = "1124090624"  # 0x43004300: 128.0 in both halves, the bfloat16 magic number
    assert magic in (fixed.program_dir / "module" / "source.cu").read_text()
    assert magic not in (slow.program_dir / "module" / "source.cu").read_text()


def test_a_96_column_tile_is_one_wgmma_wide_only_with_the_fix(fresh_cache):
    """Hopper V5 with 128 x 96 tiles: one ``m64n96k16`` per warpgroup and K step, where tilus alone
    issues three ``m64n32k16`` (``gcd(96, 256)``); a 256-column tile is the same program either way."""
    module = versions.load("sm_90a", "v5")
    narrow = dict(module.REPRESENTATIVE, block_n=96, stages=7)
    fixed, faulty = build_with_and_without("wgmma_instruction_width", module, narrow, fresh_cache / "narrow")
    shapes = [set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", r.ptx())) for r in (fixed, faulty)]
    assert shapes == [{"m64n96k16"}, {"m64n32k16"}]
    assert [r.ptx().count("wgmma.mma_async") for r in (fixed, faulty)] == [16, 48]
    wide = build_with_and_without("wgmma_instruction_width", module, module.REPRESENTATIVE, fresh_cache / "wide")
    sources = [(result.program_dir / "module" / "source.cu").read_text() for result in wide]
    assert sources[0] == sources[1] and "m64n256k16" in sources[0]


def test_a_tiles_wgmma_descriptors_are_its_base_plus_a_constant_only_with_the_fix(fresh_cache):
    """Hopper V5 with 128 x 96 tiles, four wgmma a K block: with the fix each descriptor is the
    tile's base descriptor plus the instruction's offset shifted (2, 4, 6: 32 bytes a K step), so
    only the base addresses are encoded; tilus alone encodes every offset address in full."""
    module = versions.load("sm_90a", "v5")
    config = dict(module.REPRESENTATIVE, block_n=96, stages=7)
    fixed, faulty = build_with_and_without("wgmma_descriptor_offsets", module, config, fresh_cache)
    assert fixed.ok and faulty.ok
    sources = [(result.program_dir / "module" / "source.cu").read_text() for result in (fixed, faulty)]
    offset_encoded = r"encode_smem_descriptor\(\(\(uint32_t\)\(\(\((?:shared|uniform)_addr(?:_\d+)? \+ \d+\) >> 4"
    plus_constant = r"\) \+ uint64_t\((\d+)ull\)\)"
    assert not re.search(offset_encoded, sources[0]) and re.search(offset_encoded, sources[1])
    assert {int(c) for c in re.findall(plus_constant, sources[0])} == {2, 4, 6}
    assert not re.search(plus_constant, sources[1])
    # the same instructions either way: only how their operands are computed differs
    assert [r.ptx().count("wgmma.mma_async") for r in (fixed, faulty)] == [16, 16]


def test_a_k_loops_wgmma_descriptors_stay_uniform_only_with_the_fix(fresh_cache):
    """Hopper V7 with 128-token tiles (one consumer warpgroup, eight stages): with the fix each wgmma
    takes its shared operands' addresses from lane 0, and where a disassembler is installed the K
    loop builds its descriptors in uniform registers (two moves into them a K block, not sixteen)
    and is shorter; the same wgmma instructions either way."""
    from matmul.tilus_fixes import disassembler

    module = versions.load("sm_90a", "v7")
    config = dict(block_m=128, warpgroups=1, split=1, stages=8, multicast=2)
    fixed, faulty = build_with_and_without("wgmma_uniform_descriptors", module, config, fresh_cache)
    assert fixed.ok and faulty.ok
    sources = [(result.program_dir / "module" / "source.cu").read_text() for result in (fixed, faulty)]
    assert "__shfl_sync(" in sources[0] and "__shfl_sync(" not in sources[1]
    assert [r.ptx().count("wgmma.mma_async") for r in (fixed, faulty)] == [8, 8]  # the peeled K block and the loop
    if disassembler() is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install '.[sass]'): the SASS is not checked")
    loops = [result.mma_loop() for result in (fixed, faulty)]
    moves = [sum(re.match(r"(@!?U?P\w+ )?R2UR\b", text) is not None for text in loop) for loop in loops]
    assert moves[0] <= 2 < 8 <= moves[1], moves
    assert len(loops[0]) < len(loops[1]) - 16, [len(loop) for loop in loops]


def test_two_threads_instantiating_kernels_at_once_need_serial_instantiation():
    """A serving loop's threads meeting kernels for the first time together transpile them at once.
    tilus's transpiler keeps its builder in a module global: without ``serial_instantiation`` one
    thread clears it under the other ("No valid schedule found"); with it every transpile succeeds.
    The interpreter switches threads every microsecond here, so that the transpiles interleave."""
    import concurrent.futures
    import sys

    from tilus.lang.instantiated_script import CallParameters, JitInstance

    from matmul.build.compiler import target

    module = versions.load("sm_90a", "v7")
    params = CallParameters(module.Kernel)
    divisibility = {params.param_names[i]: 1 for i in params.tuning_params}
    job = (module.Kernel, params, {"dtype": tilus.float16, **module.REPRESENTATIVE}, {}, divisibility)

    def failures() -> int:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            programs = list(pool.map(lambda _: JitInstance._instantiate_schedule(job), range(8)))
        return sum(isinstance(program, str) for program in programs)  # a str: tilus's failure report

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with target("sm_90a"):
            assert failures() == 0
            with tilus_fixes.disabled("serial_instantiation"):
                assert failures() > 0
    finally:
        sys.setswitchinterval(interval)
