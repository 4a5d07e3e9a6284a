import subprocess
import sys


def test_compile_command_reports_and_writes_ptx(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "matmul", "compile", "--arch", "sm_90a", "--versions", "v1", "--out", str(tmp_path)],
        capture_output=True, text=True,
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
