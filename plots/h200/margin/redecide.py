"""A shipped choice table decided again by the tuner's rules as they stand (``tuner.redecided``),
from the call times its entries store: no GPU, no measuring. For a table made before a rule became
stricter (``tuner.VENDOR_MARGIN``).

    python plots/h200/margin/redecide.py matmul/call/shipped/h200.json   # rewrites it, prints each change
    python plots/h200/margin/redecide.py matmul/call/shipped/h100.json   # every entry stale: they stay so

An entry that turns to cuBLAS gets the fingerprint the tuner would have given it on the table's
machine: cuBLAS's depends on torch and its CUDA, so those of the table's ``machine`` are used, and
checked against the table's own cuBLAS entries. An entry made with older kernel sources stays stale.
"""

import json
import sys
from pathlib import Path

import torch

from matmul.call import tuner
from matmul.call.chooser import key_parts


def as_on(machine: dict) -> None:
    """Make ``tuner.fingerprint`` of cuBLAS what it was on ``machine`` (its torch and CUDA)."""
    torch.__version__ = machine["torch"]
    torch.version.cuda = machine["cuda"]


def main(path: Path) -> None:
    table = json.loads(path.read_text())
    as_on(table["machine"])
    entries = table["entries"]
    reproduced = 0  # cuBLAS's fingerprints as the table's machine made them (where still fresh)
    for key, entry in entries.items():
        if entry["version"] == tuner.VENDOR:
            made = tuner.choice_fingerprint(
                key_parts(key)[0].partition("/")[0], tuner.VENDOR, tuner.timed_against(entry)
            )
            reproduced += made == entry["fingerprint"]
    changed = 0
    for key, entry in entries.items():
        head, dtype, m, n, k, _ = key_parts(key)
        arch, shape = head.partition("/")[0], f"{m}x{n}x{k}"
        after = tuner.redecided(arch, entry, int(m))
        if after["version"] == tuner.VENDOR and after is not entry and tuner.entry_is_valid(arch, after):
            assert reproduced, f"{key}: cuBLAS's fingerprint on the table's machine is not reproduced here"
        was = (entry["version"], entry.get("from_m"), entry.get("lost_at"))
        now = (after["version"], after.get("from_m"), after.get("lost_at"))
        if was != now:
            changed += 1
            print(f"{dtype:9} {shape:18} {was} -> {now}")
            entries[key] = after
    table["redecided"] = {"by": "plots/h200/margin/redecide.py", "vendor_margin": tuner.VENDOR_MARGIN}
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{changed} of {len(entries)} entries changed (VENDOR_MARGIN {tuner.VENDOR_MARGIN})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
