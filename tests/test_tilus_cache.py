"""tilus's own on-disk autotuning result, with real tilus objects and no GPU: a corrupt dispatch
table is removed before tilus reads it (tilus alone would raise), and the configuration tilus chose
is read back. One configuration of Hopper V1 is built (cached in a private tilus cache)."""

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, sys, torch
    from matmul import build
    from matmul.call import tilus_autotune
    from matmul.kernels import versions
    module = versions.load("sm_90a", "v1")
    args = (1000, 4095, 17, None, None, None, 24, 24, 4096, None)  # sizes and strides; no pointer is read
    with build.target("sm_90a"):
        script = versions.kernel(module, torch.float16, dict(module.REPRESENTATIVE))
        if sys.argv[1] == "check":
            tilus_autotune.prepare(script, args)
        instance = tilus_autotune.jit_instance(script, args)
        try:
            instance._pick_best_program(args)  # builds; one configuration: tilus stores it without timing
        except Exception as e:
            print(json.dumps({"failed": type(e).__name__}))
            raise SystemExit(0)
        print(json.dumps({"config": tilus_autotune.tuned_config(script, args), "dir": str(instance.cache_dir)}))
""")


def child(cache, mode):
    # a new cache directory would build matmul()'s native entry again: not what is tested here
    env = {**os.environ, "MATMUL_CACHE_DIR": str(cache), "MATMUL_NATIVE_ENTRY": "0"}
    env.pop("TILUS_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_corrupt_tilus_dispatch_table_is_rebuilt(tmp_path):
    first = child(tmp_path, "check")
    assert first["config"] == {"block_m": 128, "block_n": 128, "block_k": 64}
    table = os.path.join(first["dir"], "dispatch_table.pickle")
    assert first["dir"].startswith(str(tmp_path / "tilus")) and os.path.exists(table)

    with open(table, "wb") as f:
        f.write(b"\x80\x04garbage")
    assert child(tmp_path, "trust") == {"failed": "UnpicklingError"}  # what tilus 0.2.0 does on its own
    assert child(tmp_path, "check")["config"] == first["config"]  # removed, stored again
    with open(table, "rb") as f:
        assert f.read(2) == b"\x80\x04" and os.path.getsize(table) > 20


def test_a_built_kernels_library_is_opened_without_holding_the_gil(tmp_path):
    """A library whose constructor takes 300 ms (as a dynamic link and the CUDA runtime's kernel
    registration take time) is opened on another thread while this one goes on running Python:
    the caller's calls are not held up by the chooser's thread loading a kernel."""
    import shutil
    import threading
    import time

    import pytest

    from matmul.call import tilus_autotune

    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in library")
    source = tmp_path / "slow.c"
    source.write_text("#include <unistd.h>\n__attribute__((constructor)) static void slow(void) { usleep(300000); }\n")
    library = tmp_path / "libslow.so"
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    opened = []
    opener = threading.Thread(target=lambda: opened.append(tilus_autotune.open_without_the_gil(library)))
    ticks, begin = 0, time.perf_counter()
    opener.start()
    while opener.is_alive():
        ticks += 1
        time.sleep(0.001)
    elapsed = time.perf_counter() - begin
    assert opened == [True] and elapsed >= 0.25
    assert ticks >= 100  # about one a millisecond while the library opened
