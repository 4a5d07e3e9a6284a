"""The check of the result's coverage: every element of C stored exactly once, from an accumulator
that took every K block of its rows and columns exactly once, as the provenance tags that followed
the data say (``state.LoadTag``: which tile of A or B a load brought in; ``state.AccTag``: which
loads each MMA added into an accumulator).

``CoverageChecks`` is a mixin of ``machine.Machine`` (it uses ``problem``, ``stored``, ``k_block``,
``c_columns``, ``column_ratio``, ``log`` and ``fail``): the one check about what the kernel computes
rather than how it synchronizes; the instructions feed it at each store into C and the machine
closes it at the end of a run. A batched kernel's C is one matrix a product, each stored from
loads of its own product only; swiglu's C has one column per gate-up pair of the product's.
"""

from __future__ import annotations

import numpy as np

from .state import AccTag, PiecedTag, Role


class CoverageChecks:
    """The coverage of C, checked store by store and at the end of a run."""

    def record_store(self, role: Role, tags: list, offsets: list, shape: tuple, why: str) -> None:
        p = self.problem
        batch, (r0, c0) = (offsets[0], offsets[1:]) if len(offsets) == 3 else (0, offsets)
        r1, c1 = min(r0 + shape[0], p.m), min(c0 + shape[1], self.c_columns)
        r0, c0 = max(r0, 0), max(c0, 0)
        where = f"C[{batch}][{r0}:{r1}, {c0}:{c1}]" if p.batches else f"C[{r0}:{r1}, {c0}:{c1}]"
        self.log(f"{role.name}: {why} {where}")
        if r1 <= r0 or c1 <= c0:
            return
        if not 0 <= batch < len(self.stored):
            self.fail("coverage", f"{role.name} stores {where}, past the batch")
        accs = [t for t in tags if isinstance(t, (AccTag, PiecedTag))]
        if not accs:
            self.fail("coverage", f"{role.name} stores {where} from data no MMA computed")
        for acc in accs:
            if isinstance(acc, AccTag):
                self.check_acc(role, acc, r0, r1, c0, c1, f"{role.name} stores {where}", batch)
            else:
                self.check_pieces(role, acc, offsets[-2:], shape, (r0, r1, c0, c1), where, batch)
        self.stored[batch, r0:r1, c0:c1] += 1

    def check_pieces(self, role, tag: PiecedTag, origin, shape: tuple, region: tuple, where: str, batch: int) -> None:
        """A value several accumulators wrote, stored at ``origin``: its pieces must tile its rows
        (its columns, transposed), and each accumulator is checked against the part of the stored
        ``region`` of C (clipped to the matrix) that it fills."""
        along = shape[1] if tag.transposed else shape[0]
        bounds = [0] + [last for _, _, last in tag.pieces]
        if [(first, last) for _, first, last in tag.pieces] != list(zip(bounds, bounds[1:])) or bounds[-1] != along:
            self.fail("coverage", f"{role.name} stores {where}, part of it from data no MMA computed")
        r0, r1, c0, c1 = region
        for acc, first, last in tag.pieces:
            if tag.transposed:
                lo, hi = max(origin[1] + first, c0), min(origin[1] + last, c1)
                part = (r0, r1, lo, hi)
            else:
                lo, hi = max(origin[0] + first, r0), min(origin[0] + last, r1)
                part = (lo, hi, c0, c1)
            if lo < hi:
                self.check_acc(role, acc, *part, f"{role.name} stores {where}", batch)

    def check_acc(self, role, acc: AccTag, r0, r1, c0, c1, where: str, batch: int = 0) -> None:
        ks = []
        for first, second in acc.terms:
            foreign = sorted({t.batch for t in first | second} - {batch})
            if foreign:
                self.fail("coverage", f"{where}: an MMA read A or B of product {foreign[0]}")
            if all(t.k0 >= self.problem.k for t in first | second):
                continue  # a K block wholly past K (a split that got none): TMA fills it with zeros
            # which operand holds A's rows is the MMA's business (swap-AB kernels compute C^T)
            loads = first | second
            a_loads = frozenset(t for t in loads if t.matrix == "A")
            b_loads = frozenset(t for t in loads if t.matrix == "B")
            # the MMA's K block: its narrowest load, which every other load must cover (V8 widens a
            # 128-column weight tile for two MMAs, each with a 64-column token tile)
            narrowest = min(loads, key=lambda t: t.cols)
            covered = all(t.k0 <= narrowest.k0 and narrowest.k0 + narrowest.cols <= t.k0 + t.cols for t in loads)
            k_offsets = {narrowest.k0} if covered else {t.k0 for t in loads}
            if len(k_offsets) != 1 or not a_loads or not b_loads:
                self.fail(
                    "coverage",
                    f"{where}: one MMA read A and B of different K blocks, or not both ({sorted(k_offsets)})",
                )
            if ({t.matrix for t in first} == {t.matrix for t in second}) or len(a_loads | b_loads) != len(loads):
                self.fail("coverage", f"{where}: an MMA read the wrong operand")
            ratio = self.column_ratio
            if not _covers(a_loads, r0, r1) or not _covers(b_loads, ratio * c0, ratio * c1):
                self.fail(
                    "coverage",
                    f"{where}: an MMA at K offset {k_offsets.pop()} read A or B tiles that do "
                    f"not hold these rows/columns",
                )
            ks.append(next(iter(k_offsets)))
        block = self.k_block
        want = list(range(0, self.problem.k, block)) if block else []
        if sorted(ks) != want:
            missing = sorted(set(want) - set(ks))
            extra = sorted(k for k in set(ks) if ks.count(k) > 1 or k not in want)
            self.fail(
                "coverage",
                f"{where}: accumulated K offsets {sorted(ks)}; missing {missing}, repeated or foreign {extra}",
            )

    def check_coverage(self) -> None:
        bad = np.argwhere(self.stored != 1)
        if len(bad):
            b, r, c = bad[0]
            count = self.stored[b, r, c]
            never = int((self.stored == 0).sum())
            twice = int((self.stored > 1).sum())
            self.fail(
                "coverage",
                f"C[{b}][{r}, {c}] stored {count} times ({never} elements never stored, {twice} stored more than once)",
            )


def _covers(loads, lo: int, hi: int) -> bool:
    spans = sorted((t.row0, t.row0 + t.rows) for t in loads)
    at = lo
    for s, e in spans:
        if s > at:
            break
        at = max(at, e)
    return at >= hi
