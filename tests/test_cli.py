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
