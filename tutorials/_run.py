"""Execute tutorial notebooks top to bottom, as the tests do, and optionally keep the executed
copies (with their outputs) somewhere outside the repository:

    python tutorials/_run.py tutorials/v0_minimal.ipynb --out /tmp/executed
    python tutorials/_run.py tutorials/v*.ipynb            # run only: fails on the first failing cell

Each notebook runs in a fresh Jupyter kernel (ipykernel) started with this interpreter, with
``tutorials/`` as its working directory. tests/test_notebooks.py uses ``execute``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 600  # one cell may build two kernels from scratch on a slow machine


def execute(path: Path, out: Path | None = None, timeout: int = CELL_TIMEOUT_S):
    """Run every cell of ``path``; raise ``nbclient.exceptions.CellExecutionError`` (which shows the
    failing cell and its traceback) if one fails. Returns the executed notebook."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as tmp:
        # a kernel spec of our own: the kernel runs this interpreter, whatever 'python' is on PATH
        spec = Path(tmp) / "kernels" / "tutorials"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "tutorials", "language": "python"}))
        km = AsyncKernelManager(kernel_name="tutorials", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=False,
                                resources={"metadata": {"path": str(TUTORIALS)}})
        try:
            client.execute()
        finally:
            if out is not None:
                Path(out).mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, Path(out) / Path(path).name)  # partial outputs too, to see where it failed
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write the executed notebooks here (never into tutorials/)")
    args = parser.parse_args(argv)
    if args.out is not None and args.out.resolve() == TUTORIALS:
        parser.error("tutorials/ holds the notebooks without outputs: choose another --out")
    for path in args.notebooks:
        start = time.time()
        execute(path, args.out)
        print(f"ran {path} in {time.time() - start:.0f} s" + (f" -> {args.out / path.name}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
