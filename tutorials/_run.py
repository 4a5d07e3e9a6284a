"""Execute tutorial notebooks top to bottom, as the tests do, and keep what they printed:

    python tutorials/_run.py tutorials/v*.ipynb --inplace                  # outputs into the notebooks
    python tutorials/_run.py tutorials/v0_minimal.ipynb --out /tmp/executed  # executed copies elsewhere
    python tutorials/_run.py tutorials/v*.ipynb --inplace --tar /tmp/notebooks.tar  # and pack them
    python tutorials/_run.py --unpack /tmp/notebooks.tar                   # back into tutorials/
    python tutorials/_run.py tutorials/v*.ipynb                            # run only, keep nothing

Each notebook runs in a fresh Jupyter kernel (ipykernel) started with this interpreter, with
``tutorials/`` as its working directory; a failing cell stops the run with its traceback (with
``--out``, the partly executed copy is written first, to show where; ``--inplace`` writes a
notebook only once all its cells ran). An executed notebook's
metadata records what produced its outputs (``tutorial.executed``: commit, GPU, date, software);
the commit is ``$MATMUL_TUTORIALS_COMMIT`` when set (a machine whose ``.git`` is older than its
working tree), else ``git describe --always --dirty``. ``--tar`` packs the executed notebooks
into one file (a GPU machine that returns only a few files; with ``--keep-going`` a failing
notebook is reported and left out, the others still run and are packed); ``--unpack`` writes a pack's
notebooks into ``tutorials/`` and nothing else. tests/test_notebooks.py uses ``execute``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 600  # one cell may build two kernels from scratch on a slow machine


def provenance() -> dict:
    """What is producing the outputs: the commit, the GPU (or none), when, and the software."""
    import platform

    import torch

    sys.path.insert(0, str(TUTORIALS))
    import _helpers

    return {
        "commit": _helpers.commit(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def execute(path: Path, out: Path | None = None, timeout: int = CELL_TIMEOUT_S, stamp: dict | None = None):
    """Run every cell of ``path`` (the file itself is only read); raise
    ``nbclient.exceptions.CellExecutionError`` (which shows the failing cell and its traceback) if
    one fails. With ``out`` (a file or a folder), write the executed notebook there. Returns it."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    path = Path(path)
    if out is not None:
        out = Path(out)
        out = out if out.suffix == ".ipynb" else out / path.name
    with tempfile.TemporaryDirectory() as tmp:
        # a kernel spec of our own: the kernel runs this interpreter, whatever 'python' is on PATH
        spec = Path(tmp) / "kernels" / "tutorials"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "tutorials",
                    "language": "python",
                    # no progress bars in the outputs: tilus draws one for every kernel it builds, which
                    # says how empty this machine's cache was, nothing about the lesson
                    "env": {"TQDM_DISABLE": "1"},
                }
            )
        )
        km = AsyncKernelManager(
            kernel_name="tutorials", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)])
        )
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb, km=km, timeout=timeout, allow_errors=False, resources={"metadata": {"path": str(TUTORIALS)}}
        )
        try:
            client.execute()
            if stamp is not None:
                nb.metadata.setdefault("tutorial", {})["executed"] = stamp
        finally:
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, out)  # partial outputs too, to see where it failed
    return nb


def pack(paths: list[Path], tar: Path) -> None:
    """The notebooks, by file name only, into one tar file."""
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar, "w") as archive:
        for path in paths:
            archive.add(path, arcname=Path(path).name)


def unpack(tar: Path, into: Path = TUTORIALS) -> list[Path]:
    """Write a pack's notebooks into ``into``: plain ``.ipynb`` members named like the tutorials,
    nothing else (no folders, no other files)."""
    written = []
    with tarfile.open(tar) as archive:
        for member in archive.getmembers():
            name = member.name
            if not (member.isfile() and "/" not in name and name.startswith("v") and name.endswith(".ipynb")):
                raise SystemExit(f"{tar}: unexpected member {name!r}; only tutorial notebooks are unpacked")
            target = into / name
            target.write_bytes(archive.extractfile(member).read())
            written.append(target)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--inplace", action="store_true", help="write the outputs into the notebooks themselves")
    where.add_argument("--out", type=Path, help="write the executed notebooks into this folder")
    parser.add_argument("--tar", type=Path, help="then pack the executed notebooks into this tar file")
    parser.add_argument("--unpack", type=Path, metavar="TAR", help="write a pack's notebooks into tutorials/ and stop")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell")
    parser.add_argument(
        "--keep-going", action="store_true", help="run (and pack) the other notebooks when one fails; exit 1 at the end"
    )
    args = parser.parse_args(argv)
    if args.unpack:
        for path in unpack(args.unpack):
            print(f"unpacked {path}")
        return 0
    if not args.notebooks:
        parser.error("name the notebooks to run")
    if args.tar and not (args.inplace or args.out):
        parser.error("--tar packs executed notebooks: give --inplace or --out too")
    if args.out is not None and args.out.resolve() == TUTORIALS:
        parser.error("to write into tutorials/, use --inplace")
    stamp = provenance()
    print(f"outputs of commit {stamp['commit']} on {stamp['gpu']}")
    written, failed = [], []
    for path in args.notebooks:
        start = time.time()
        target = path if args.inplace else (args.out / path.name if args.out else None)
        try:
            nb = execute(path, None if args.inplace else target, args.timeout, stamp)
        except Exception as e:  # CellExecutionError names the cell and shows its traceback
            if not args.keep_going:
                raise
            failed.append(path)
            print(f"FAILED {path} after {time.time() - start:.0f} s:\n{str(e)[-3000:]}", flush=True)
            continue
        if args.inplace:  # only once every cell ran: a failure leaves the committed notebook as it was
            import nbformat

            nbformat.write(nb, path)
        written += [target] if target else []
        print(f"ran {path} in {time.time() - start:.0f} s" + (f" -> {target}" if target else ""), flush=True)
    if args.tar:
        pack(written, args.tar)
        print(f"packed {len(written)} notebook(s) into {args.tar}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(map(str, failed))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
