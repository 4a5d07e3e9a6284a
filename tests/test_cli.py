import os
import subprocess
import sys


def test_compile_command_reports_and_writes_ptx(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "matmul", "compile", "--arch", "sm_90a", "--versions", "v1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("sm_90a"))
    assert "v1" in row and "wgmma.mma_async" in row and "MISSING" not in row
    assert "wgmma.mma_async" in (tmp_path / "sm_90a" / "v1.ptx").read_text()


def test_compile_command_rejects_unknown_arch_and_version():
    for args in (["--arch", "sm_80"], ["--versions", "v9"]):
        proc = subprocess.run([sys.executable, "-m", "matmul", "compile", *args], capture_output=True, text=True)
        assert proc.returncode != 0
        assert ("unknown architecture" in proc.stderr) or ("unknown version" in proc.stderr)


def test_compile_covers_every_version_v8_of_both_architectures_included(capsys):
    """``compile`` builds every version the package has: the series and the packed-weight versions,
    V8 for sm_90a and for sm_100a (``--list`` names them without building)."""
    from matmul import cli
    from matmul.kernels import versions

    def listed(*args):
        assert cli.main(["compile", "--list", *args]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
        return [(row[0], row[1]) for row in rows]

    everything = listed()
    for arch in versions.ARCHS:
        assert [v for a, v in everything if a == arch] == versions.available(arch) + versions.quantized(arch)
    assert ("sm_90a", "v8") in everything and ("sm_100a", "v8") in everything
    assert listed("--versions", "v8") == [("sm_100a", "v8"), ("sm_90a", "v8")]
    assert listed("--versions", "v8_prefill,v1") == [("sm_100a", "v1"), ("sm_90a", "v8_prefill"), ("sm_90a", "v1")]


def test_compile_reports_v8_of_both_architectures(tmp_path, monkeypatch, capsys):
    """The report's V8 rows from the real representative builds (``conftest.representative_build``,
    built once a session): both architectures, every PTX marker found, the PTX written out."""
    from conftest import representative_build

    from matmul import build, cli

    def representative(module, arch, all_configs=False, progress=None):
        return [representative_build(arch, module.__name__.rsplit(".", 1)[-1])]

    monkeypatch.setattr(build, "build_version", representative)
    assert cli.main(["compile", "--versions", "v8", "--no-check", "--out", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sm_")]
    assert [row.split()[:2] for row in rows] == [["sm_100a", "v8"], ["sm_90a", "v8"]]
    assert all("MISSING" not in row for row in rows)
    assert "tcgen05.mma" in (tmp_path / "sm_100a" / "v8.ptx").read_text()
    assert "wgmma.mma_async" in (tmp_path / "sm_90a" / "v8.ptx").read_text()


def test_compile_compare_tells_the_same_ptx_from_a_changed_one(tmp_path):
    """--compare is how a refactoring shows it changed no kernel: same PTX reads 'same', one changed
    instruction reads 'DIFFERENT'."""
    command = [sys.executable, "-m", "matmul", "compile", "--arch", "sm_90a", "--versions", "v0"]
    first = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run([*command, "--compare", str(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert next(line for line in again.stdout.splitlines() if line.startswith("sm_90a")).endswith("same")
    ptx = tmp_path / "sm_90a" / "v0.ptx"
    ptx.write_text(ptx.read_text().replace("wgmma.wait_group.sync.aligned 0", "wgmma.wait_group.sync.aligned 1", 1))
    changed = subprocess.run([*command, "--compare", str(tmp_path)], capture_output=True, text=True)
    assert next(line for line in changed.stdout.splitlines() if line.startswith("sm_90a")).endswith("DIFFERENT")


def test_candidates_checks_then_times_each_configuration_against_cublas(monkeypatch):
    """The candidates command's loop on the CPU with stand-in kernels: a wrong configuration is
    reported and not timed, the right ones are timed against cuBLAS and the best is named."""
    import functools

    import torch
    from stand_ins import install

    from matmul.harness import bench, candidates
    from matmul.kernels import versions
    from matmul.measure import correctness

    install(monkeypatch, wrong=("v0",))
    cpu = functools.partial(correctness.random_operands, device="cpu")
    monkeypatch.setattr(candidates, "random_operands", lambda m, n, k, dtype: cpu(m, n, k, dtype))
    monkeypatch.setattr(candidates, "poisoned_output", functools.partial(correctness.poisoned_output, device="cpu"))

    def run_on_the_cpu(module, a, b, out, config=None):  # versions.run without its CUDA-only contract check
        versions.kernel(module, a.dtype, config)(*versions.launch_args(a, b, out))
        return out

    monkeypatch.setattr(versions, "run", run_on_the_cpu)
    speed = {"cuBLAS": 1.0, "v1 block_m=128": 0.8, "v1 block_m=64": 1.25}

    def timer(fns):  # each window: the candidate, then cuBLAS; times by who ran
        return [speed[name] for name in timer.names]

    measure = bench.measure

    def named_measure(shape, found, ref, dtype, timer_, rounds, paired=True):
        def timing(fns):
            timer.names = [next(c.name for c in found if c.run is fn) for fn in fns]
            return timer(fns)

        return measure(shape, found, ref, dtype, timing, rounds, paired=paired)

    monkeypatch.setattr(candidates.bench, "measure", named_measure)
    chosen = [
        *candidates.parse("v0:block_m=128", "sm_90a"),
        *candidates.parse("v1:block_m=128", "sm_90a"),
        *candidates.parse("v1:block_m=64", "sm_90a"),
    ]
    lines = []
    rows = candidates.measure("sm_90a", chosen, [(40, 24, 17)], rounds=2, print_=lines.append)
    assert any("v0 block_m=128: WRONG" in line for line in lines)
    assert {r["kernel"]: r["ok"] for r in rows}["v1 block_m=64"], rows
    assert lines[-1] == "BEST 40x24x17 v1 block_m=128: 1.250x cuBLAS"
    assert all(isinstance(r["error"], float) and not torch.is_tensor(r["error"]) for r in rows)


def test_compile_kernels_builds_a_list_into_the_cache_and_names_a_bad_line(tmp_path):
    """``compile --kernels``: each listed kernel built into $MATMUL_CACHE_DIR's tilus cache; a line
    that names no kernel fails the command and is named, the others still build."""
    import json

    listed = tmp_path / "kernels.txt"
    good = json.dumps({"block_m": 64, "block_n": 128, "block_k": 32})
    listed.write_text(f"# a comment\nv1|{good}|float16\nv9|{good}|float16\n")
    env = {**os.environ, "MATMUL_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "matmul", "compile", "--arch", "sm_90a", "--kernels", str(listed), "--jobs", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 of 2 kernels built for sm_90a" in proc.stdout
    assert "build failed: ('sm_90a', 'v9|" in proc.stdout
    assert len(list((tmp_path / "cache" / "tilus").glob("fixes-*/programs/*/module/lib.so"))) == 1


def test_the_gpu_tests_kernel_list_names_kernels_that_exist():
    """``tests/gpu_kernels.py`` (what a GPU session prebuilds): every line a version of the series,
    one of its configurations, a 16-bit dtype and a variant the version supports."""
    import json

    import gpu_kernels

    from matmul.kernels import variant as variants
    from matmul.kernels import versions

    lines = gpu_kernels.kernels()
    assert len(lines) == len(set(lines)) > 100
    for line in lines:
        version, config, dtype, *key = line.split("|")
        module = versions.load("sm_90a", version)
        named = [
            getattr(module, name) for name in dir(module) if name.isupper() and isinstance(getattr(module, name), dict)
        ]
        assert json.loads(config) in [*versions.build_configs(module), *named] or version == "v8", line
        assert dtype in ("float16", "bfloat16")
        assert variants.supported(module, variants.Variant.parse(key[0] if key else "")), line
