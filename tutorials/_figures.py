"""The tutorials' diagrams, drawn with matplotlib from the versions' own parameters.

Every timeline here is a schematic (the order of events, not measured durations); the notebooks
say so under each one.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

COLORS = {
    "load": "#4C72B0",
    "tma": "#4C72B0",
    "mma": "#DD8452",
    "wait": "#CCCCCC",
    "epilogue": "#55A868",
    "store": "#55A868",
    "sched": "#8172B3",
    "idle": "#EEEEEE",
    "a": "#9ecae1",
    "b": "#fdae6b",
    "c": "#a1d99b",
    "peer": "#c994c7",
}


# -- tiles ----------------------------------------------------------------------------------------


def tiles(
    block_m: int,
    block_n: int,
    block_k: int,
    m_tiles: int = 4,
    n_tiles: int = 3,
    k_blocks: int = 5,
    tile: tuple[int, int] = (1, 2),
    k_step: int | None = 1,
    title: str = "",
):
    """A [M, K], B [N, K] and C [M, N] cut into tiles: the CTA of output tile ``tile`` walks the K
    blocks of one row band of A and one row band of B (C = A @ B^T)."""
    tm, tn = tile
    fig, axes = plt.subplots(1, 3, figsize=(12, 4), gridspec_kw={"width_ratios": [k_blocks, k_blocks, n_tiles]})
    panels = [("A  [M, K]", m_tiles, k_blocks, tm, "a"), ("B  [N, K]", n_tiles, k_blocks, tn, "b")]
    for ax, (name, rows, cols, band, color) in zip(axes[:2], panels):
        for r in range(rows):
            for c in range(cols):
                face = COLORS[color] if r == band else "white"
                if r == band and k_step is not None and c == k_step:
                    face = COLORS["mma"]
                ax.add_patch(Rectangle((c, rows - 1 - r), 1, 1, facecolor=face, edgecolor="grey"))
                if r == band:
                    ax.text(c + 0.5, rows - 0.5 - r, f"k{c}", ha="center", va="center", fontsize=9)
        ax.set_xlim(0, cols)
        ax.set_ylim(0, rows)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(name)
    axes[0].set_xlabel(f"K blocks of {block_k}; one tile = {block_m} x {block_k}")
    axes[1].set_xlabel(f"one tile = {block_n} x {block_k}")
    ax = axes[2]
    for r in range(m_tiles):
        for c in range(n_tiles):
            face = COLORS["c"] if (r, c) == tile else "white"
            ax.add_patch(Rectangle((c, m_tiles - 1 - r), 1, 1, facecolor=face, edgecolor="grey"))
            ax.text(c + 0.5, m_tiles - 0.5 - r, f"({r},{c})", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, n_tiles)
    ax.set_ylim(0, m_tiles)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("C  [M, N]")
    ax.set_xlabel(f"one tile = {block_m} x {block_n}: one CTA")
    fig.suptitle(
        title or f"CTA ({tm},{tn}) computes C tile ({tm},{tn}) = sum over k of A tile (tm, k) @ B tile (tn, k)^T"
    )
    fig.tight_layout()
    return fig


# -- timelines ------------------------------------------------------------------------------------


def timeline(
    lanes: list[tuple[str, list[tuple[float, float, str, str]]]],
    title: str,
    xlabel: str = "time (schematic)",
    width: float = 12,
    arrows: list[tuple[tuple[float, int], tuple[float, int]]] = (),
):
    """A Gantt chart: one lane per actor, boxes (start, length, label, color key or color)."""
    fig, ax = plt.subplots(figsize=(width, 0.7 * len(lanes) + 1.2))
    for row, (_name, boxes) in enumerate(lanes):
        y = len(lanes) - 1 - row
        for start, length, label, color in boxes:
            ax.add_patch(
                Rectangle(
                    (start, y + 0.15), length, 0.7, facecolor=COLORS.get(color, color), edgecolor="black", linewidth=0.6
                )
            )
            if label:
                ax.text(start + length / 2, y + 0.5, label, ha="center", va="center", fontsize=8)
    for (x0, r0), (x1, r1) in arrows:
        y0, y1 = len(lanes) - 1 - r0 + 0.5, len(lanes) - 1 - r1 + 0.5
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="->", mutation_scale=10, color="#444444"))
    end = max((s + l for _, boxes in lanes for s, l, _, _ in boxes), default=1)
    ax.set_xlim(0, end + 0.2)
    ax.set_ylim(0, len(lanes))
    ax.set_yticks([len(lanes) - 1 - i + 0.5 for i in range(len(lanes))], [name for name, _ in lanes])
    ax.set_xticks([])
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def serial_k_loop(
    k_blocks: int = 4,
    load: float = 2.0,
    mma: float = 1.0,
    loader: str = "all 128 threads",
    load_label: str = "load",
    title: str = "",
):
    """One CTA's K loop when loading and computing take turns: while the tiles load the tensor
    core idles, while it computes nobody loads."""
    t = 0.0
    loads, mmas = [], []
    for k in range(k_blocks):
        loads.append((t, load, f"{load_label} k{k}", "load"))
        t += load
        mmas.append((t, mma, f"mma k{k}", "mma"))
        t += mma
    epilogue = [(t, 1.2, "epilogue", "epilogue")]
    return timeline(
        [(loader, loads + epilogue), ("tensor core", mmas)],
        title or "Loads and MMAs take turns: each waits for the other",
    )


def pipelined_k_loop(stages: int, k_blocks: int = 8, load: float = 2.0, mma: float = 1.0, title: str = ""):
    """A K loop over a ring of ``stages`` shared-memory slots: the load of K block k goes into slot
    k % stages as soon as the MMA that last read that slot (k - stages) is done, and is in flight for
    ``load`` time units (loads in different slots overlap); the MMA of block k starts when its load
    has landed and the previous MMA is done. ``stages=1`` is V1: load and MMA take turns."""
    load_end, mma_end = [], []
    slots = [[] for _ in range(stages)]
    mmas = []
    for k in range(k_blocks):
        start = mma_end[k - stages] if k >= stages else 0.0
        slots[k % stages].append((start, load, f"load k{k}", "load"))
        load_end.append(start + load)
        begin = max(load_end[k], mma_end[-1] if mma_end else 0.0)
        slots[k % stages].append((begin, mma, f"read k{k}", "mma"))
        mmas.append((begin, mma, f"mma k{k}", "mma"))
        mma_end.append(begin + mma)
    busy = sum(l for _, l, _, _ in mmas) / mma_end[-1]
    lanes = [(f"slot {s}", boxes) for s, boxes in enumerate(slots)] + [("tensor core", mmas)]
    return timeline(
        lanes,
        title or f"{stages} slot(s): tensor core busy {busy:.0%} of the time (load latency = {load / mma:g} MMAs)",
    )


# -- mbarriers ------------------------------------------------------------------------------------


def transaction_count(bytes_a: int, bytes_b: int, pieces: int = 4):
    """An mbarrier phase that counts bytes: ``arrive.expect_tx`` announces both tiles' bytes, each
    piece the TMA unit writes counts down, the phase completes at zero (pending arrivals 0 too)."""
    total = bytes_a + bytes_b
    times, pending = [0, 1], [0, total]
    t = 1.0
    for i in range(pieces):
        t += 0.6 + 0.25 * (i % 2)
        times.append(t)
        pending.append(total - (i + 1) * total / pieces)
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.step(times, [p / 1024 for p in pending], where="post", color=COLORS["tma"])
    ax.axvline(1, color="grey", linestyle=":")
    ax.text(
        1.05,
        total / 1024 * 0.95,
        "arrive.expect_tx\n(one thread: +%d KiB,\n arrivals 1 \u2192 0)" % (total // 1024),
        fontsize=8,
        va="top",
    )
    ax.axvline(t, color=COLORS["mma"], linestyle="--")
    ax.text(t + 0.05, total / 1024 * 0.5, "phase completes:\nwaiters on it go on", fontsize=8, color=COLORS["mma"])
    ax.set_xlim(0, t + 1.5)
    ax.set_xticks([])
    ax.set_xlabel("time (schematic): the TMA unit delivers the tiles piece by piece")
    ax.set_ylabel("bytes still expected (KiB)")
    ax.set_title(f"The mbarrier counts bytes: A tile {bytes_a // 1024} KiB + B tile {bytes_b // 1024} KiB")
    fig.tight_layout()
    return fig


def ring(num_stages: int, producer: int = 2, consumer: int = 0, title: str = ""):
    """A ring of shared-memory stages, each with a ``full`` and an ``empty`` mbarrier. Stages between
    the consumer and the producer hold data; the others are free."""
    import math

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    for s in range(num_stages):
        angle = math.pi / 2 - 2 * math.pi * s / num_stages
        x, y = 1.2 * math.cos(angle), 1.2 * math.sin(angle)
        holds = (s - consumer) % num_stages < (producer - consumer) % num_stages
        ax.add_patch(
            Rectangle((x - 0.4, y - 0.25), 0.8, 0.5, facecolor=COLORS["a"] if holds else "white", edgecolor="black")
        )
        ax.text(x, y + 0.08, f"stage {s}", ha="center", va="center", fontsize=10)
        ax.text(x, y - 0.12, "full" if holds else "empty", ha="center", va="center", fontsize=7, color="#333333")
        if s == producer:
            ax.annotate(
                "producer\n(TMA) fills next",
                (x, y),
                (1.75 * x, 1.75 * y),
                ha="center",
                fontsize=9,
                arrowprops=dict(arrowstyle="->", color=COLORS["tma"]),
                color=COLORS["tma"],
            )
        if s == consumer:
            ax.annotate(
                "consumer\n(MMA) reads",
                (x, y),
                (1.75 * x + 0.01, 1.75 * y + 0.01),
                ha="center",
                fontsize=9,
                arrowprops=dict(arrowstyle="->", color=COLORS["mma"]),
                color=COLORS["mma"],
            )
    ax.set_xlim(-2.3, 2.3)
    ax.set_ylim(-2.3, 2.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"A ring of {num_stages} stages")
    return fig


# -- Blackwell tensor memory ----------------------------------------------------------------------


def tensor_memory(block_m: int, block_n: int, buffers: int = 1, columns: int = 512, lanes: int = 128):
    """TMEM of one SM: 128 lanes x 512 columns of 32-bit cells. The accumulator of a block_m x
    block_n fp32 tile takes block_n columns (one row of C per lane); warp w of the epilogue reads
    lanes 32w .. 32w+31."""
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.add_patch(Rectangle((0, 0), columns, lanes, facecolor="white", edgecolor="black"))
    for b in range(buffers):
        ax.add_patch(
            Rectangle(
                (b * block_n, 0),
                block_n,
                min(block_m, lanes),
                facecolor=COLORS["c"],
                edgecolor="black",
                alpha=0.9 - 0.25 * b,
            )
        )
        ax.text(
            b * block_n + block_n / 2,
            lanes / 2,
            f"accumulator{'' if buffers == 1 else ' ' + str(b)}\n{min(block_m, lanes)} x {block_n} fp32",
            ha="center",
            va="center",
            fontsize=9,
        )
    for w in range(4):
        ax.axhline(w * 32, color="grey", linewidth=0.6, linestyle=":")
        ax.text(columns + 6, (w + 0.5) * 32, f"warp {w} reads\nlanes {32 * w}-{32 * w + 31}", va="center", fontsize=7)
    ax.set_xlim(0, columns + 70)
    ax.set_ylim(lanes, 0)
    ax.set_xlabel(f"columns (0 .. {columns - 1}), 32-bit each")
    ax.set_ylabel("lanes")
    ax.set_title(f"Tensor memory of one SM: {buffers * block_n} of {columns} columns allocated")
    fig.tight_layout()
    return fig


# -- warps ----------------------------------------------------------------------------------------


def warp_roles(roles: list[tuple[str, str, str]], title: str = "Warp roles in one CTA"):
    """``roles``: (warps, role, color key) in order, e.g. ("warp 0", "TMA producer", "tma")."""
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(roles) + 1))
    for i, (warps, role, color) in enumerate(roles):
        y = len(roles) - 1 - i
        ax.add_patch(Rectangle((0, y + 0.1), 2.2, 0.8, facecolor=COLORS.get(color, color), edgecolor="black"))
        ax.text(1.1, y + 0.5, warps, ha="center", va="center", fontsize=9)
        ax.text(2.4, y + 0.5, role, va="center", fontsize=9)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, len(roles))
    ax.axis("off")
    ax.set_title(title)
    fig.tight_layout()
    return fig


# -- rasterization --------------------------------------------------------------------------------


def raster_orders(num_m: int, num_n: int, group: int, wave: int):
    """Launch order of the tiles of C, V0-V3's 2-D grid against grouped (``pipeline.grouped_tile_order``);
    the first ``wave`` tiles (those in flight together) shaded, with how many distinct A and B tiles
    (row and column bands) they read."""
    from pipeline.schedulers import grouped_tile_order

    # a 2-D grid [M tiles, N tiles] is launched with blockIdx.x (the M tile) varying fastest
    orders = {
        "2-D grid, blockIdx.x = M tile (V0-V3)": [(i % num_m, i // num_m) for i in range(num_m * num_n)],
        f"grouped (group = {group})": grouped_tile_order(num_m, num_n, group),
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, min(12 * num_m / num_n / 2 + 1.2, 7)))
    for ax, (name, order) in zip(axes, orders.items()):
        first = order[:wave]
        for pos, (r, c) in enumerate(order):
            face = COLORS["c"] if pos < wave else "white"
            ax.add_patch(
                Rectangle(
                    (c, num_m - 1 - r),
                    1,
                    1,
                    facecolor=face,
                    edgecolor="grey",
                    linewidth=0.5 if num_m * num_n <= 256 else 0.2,
                )
            )
            if num_m * num_n <= 256:
                ax.text(c + 0.5, num_m - 0.5 - r, str(pos), ha="center", va="center", fontsize=7)
        rows, cols = len({r for r, _ in first}), len({c for _, c in first})
        ax.set_xlim(0, num_n)
        ax.set_ylim(0, num_m)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{name}\nfirst {wave} tiles read {rows} A bands + {cols} B bands = {rows + cols}")
    fig.suptitle(
        f"Launch order of a {num_m} x {num_n} grid of C tiles (shaded: the first {wave}, in flight together"
        + ("; numbers: launch order)" if num_m * num_n <= 256 else ")")
    )
    fig.tight_layout()
    return fig


# -- persistent kernels ---------------------------------------------------------------------------


def persistent(num_sms: int, tiles: int, durations=None, title: str = "", static: bool = False):
    """Each SM runs one CTA that takes tiles one after the other instead of one CTA per tile:
    dynamically (the first CTA to finish takes the next tile, as with cluster launch control) or
    statically (CTA b takes tiles b, b + num_sms, ..., fixed at launch)."""
    durations = durations or [1.0 + 0.35 * ((i * 7) % 3) for i in range(tiles)]
    free = [0.0] * num_sms
    lanes = [[] for _ in range(num_sms)]
    for t in range(tiles):
        sm = t % num_sms if static else min(range(num_sms), key=lambda s: free[s])
        lanes[sm].append((free[sm], durations[t] - 0.05, f"tile {t}", "mma"))
        free[sm] += durations[t]
    how = "static round-robin" if static else "dynamic: the next tile to whoever finishes first"
    return timeline(
        [(f"CTA on SM {s}", boxes) for s, boxes in enumerate(lanes)],
        title or f"{num_sms} persistent CTAs, {tiles} tiles, {how}: done at {max(free):.2f}",
    )


# -- 2-CTA clusters -------------------------------------------------------------------------------


def two_cta_tile(block_m: int, block_n: int, block_k: int):
    """The 2-CTA MMA's partition of one block_m x block_n output tile: each CTA loads half of A's
    rows and half of B's rows into its own shared memory; the MMA, issued by the leader CTA, reads
    both halves of B from both CTAs and writes each CTA's half of C into that CTA's tensor memory."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1, 2]})
    half_m, half_n = block_m // 2, block_n // 2
    colors = [COLORS["a"], COLORS["peer"]]
    ax = axes[0]
    for r in range(2):
        ax.add_patch(Rectangle((0, 1 - r), 1, 1, facecolor=colors[r], edgecolor="black"))
        ax.text(
            0.5, 1.5 - r, f"CTA {r}\nrows {r * half_m}..{(r + 1) * half_m - 1}", ha="center", va="center", fontsize=9
        )
    ax.set_title(f"A tile {block_m} x {block_k}")
    ax2 = axes[1]
    for r in range(2):
        ax2.add_patch(Rectangle((0, 1 - r), 1, 1, facecolor=colors[r], edgecolor="black"))
        ax2.text(
            0.5, 1.5 - r, f"CTA {r}\nrows {r * half_n}..{(r + 1) * half_n - 1}", ha="center", va="center", fontsize=9
        )
    ax2.set_title(f"B tile {block_n} x {block_k}")
    ax3 = axes[2]
    for r in range(2):
        ax3.add_patch(Rectangle((0, 1 - r), 2, 1, facecolor=colors[r], edgecolor="black", alpha=0.8))
        ax3.text(
            1,
            1.5 - r,
            f"CTA {r}'s tensor memory: C rows {r * half_m}..{(r + 1) * half_m - 1}, all {block_n} columns\n"
            f"= its A half @ (both B halves)^T",
            ha="center",
            va="center",
            fontsize=9,
        )
    ax3.set_title(f"C tile {block_m} x {block_n}")
    for a in axes:
        a.set_xlim(0, 2 if a is ax3 else 1)
        a.set_ylim(0, 2)
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle("2-CTA MMA (cta_group::2): two CTAs of a cluster, one MMA, half the operands each")
    fig.tight_layout()
    return fig


# -- shared memory budget -------------------------------------------------------------------------


def shared_memory_budget(configs: list[dict], parts, limit_bytes: int, title: str = ""):
    """Stacked bars: the shared memory each configuration of an autotune space asks for, by part
    (``parts``: (label, function of the config giving bytes, color key)), against the per-block limit."""
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(configs)), 3.6))
    labels = []
    for i, cfg in enumerate(configs):
        bottom = 0.0
        for name, nbytes, color in parts:
            value = nbytes(cfg) / 1024
            ax.bar(
                i,
                value,
                bottom=bottom,
                color=COLORS.get(color, color),
                edgecolor="black",
                label=name if i == 0 else None,
            )
            bottom += value
        ax.text(i, bottom + 3, f"{bottom:.0f}", ha="center", fontsize=8)
        labels.append("\n".join(f"{k}={v}" for k, v in cfg.items()))
    ax.axhline(limit_bytes / 1024, color="red", linestyle="--", label=f"limit {limit_bytes // 1024} KiB")
    ax.set_xticks(range(len(configs)), labels, fontsize=7)
    ax.set_ylabel("shared memory (KiB)")
    ax.set_title(title or "Shared memory per CTA, by configuration of the autotune space")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def specialized_k_loop(
    stages: int,
    k_blocks: int = 6,
    load: float = 2.0,
    mma: float = 1.0,
    epilogue: float = 2.0,
    producer: str = "TMA warp",
    issuer: str | None = "MMA warp",
    waiter: str = "epilogue warps",
    title: str = "",
):
    """Warp specialization: each role runs its own loop and meets the others only at barriers. The
    producer issues a load as soon as a slot is free, the issuer (None: the MMA is issued by the
    waiting warpgroup itself, as on Hopper) issues an MMA as soon as its slot has landed, and the
    epilogue warps wait for the accumulator, then write it out."""
    tick = 0.12
    load_end, mma_end = [], []
    issue_load, issue_mma, core = [], [], []
    for k in range(k_blocks):
        start = mma_end[k - stages] if k >= stages else 0.0
        start = max(start, issue_load[-1][0] + 3 * tick if issue_load else 0.0)  # one issue at a time
        issue_load.append((start, tick * 2, "", "tma"))
        load_end.append(start + load)
        begin = max(load_end[k], mma_end[-1] if mma_end else 0.0)
        issue_mma.append((load_end[k], tick * 2, "", "mma"))
        core.append((begin, mma, f"mma k{k}", "mma"))
        mma_end.append(begin + mma)
    end = mma_end[-1]
    lanes = [(producer, issue_load)]
    if issuer:
        lanes.append((issuer, issue_mma))
    lanes.append(("tensor core", core))
    lanes.append((waiter, [(0, end, "wait for the accumulator", "wait"), (end, epilogue, "epilogue", "epilogue")]))
    return timeline(lanes, title or "Each role runs its own loop; the thin marks are instructions issued")


def wave_traffic(
    num_m: int, num_n: int, block_m: int, block_n: int, k: int, wave: int, groups=(1, 2, 4, 8, 16), itemsize: int = 2
):
    """For each launch order, the operand bytes one wave of ``wave`` CTAs reads (each distinct A row
    band and B row band once: what L2 must hold for the wave to find its operands there), averaged
    over the full waves of the grid."""
    from pipeline.schedulers import grouped_tile_order

    orders = {"2-D grid (V0-V3)": [(i % num_m, i // num_m) for i in range(num_m * num_n)]}
    orders.update({f"grouped, group={g}": grouped_tile_order(num_m, num_n, g) for g in groups})
    names, mib = [], []
    for name, order in orders.items():
        waves = [order[i : i + wave] for i in range(0, len(order) - wave + 1, wave)] or [order]
        per_wave = [
            len({r for r, _ in w}) * block_m * k * itemsize + len({c for _, c in w}) * block_n * k * itemsize
            for w in waves
        ]
        names.append(name)
        mib.append(sum(per_wave) / len(per_wave) / 2**20)
    fig, ax = plt.subplots(figsize=(9, 3.4))
    bars = ax.barh(names[::-1], mib[::-1], color=[COLORS["a"]] * (len(names) - 1) + [COLORS["wait"]])
    for bar, value in zip(bars, mib[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.0f} MiB", va="center", fontsize=8)
    ax.set_xlabel("operand bytes one wave reads (MiB), the less the better")
    ax.set_title(f"{num_m} x {num_n} tiles of {block_m} x {block_n}, K = {k}, waves of {wave} CTAs")
    fig.tight_layout()
    return fig


def persistent_overlap(
    tiles: int = 3, setup: float = 0.8, mainloop: float = 3.0, epilogue: float = 1.6, acc_stages: int = 2
):
    """One SM over time. Top: one CTA per tile (V4): set-up, main loop, epilogue, then the next CTA.
    Bottom: one persistent CTA (V5) with ``acc_stages`` accumulator buffers in tensor memory: the
    MMA warp starts tile i+1 while the epilogue warps drain tile i."""
    v4_core, v4_epi, t = [], [], 0.0
    for i in range(tiles):
        v4_core.append((t, setup, "set-up", "wait"))
        v4_core.append((t + setup, mainloop, f"main loop t{i}", "mma"))
        t += setup + mainloop
        v4_epi.append((t, epilogue, f"epilogue t{i}", "epilogue"))
        t += epilogue
    v5_core, v5_epi = [(0.0, setup, "set-up", "wait")], []
    core_end, epi_end = [], []
    for i in range(tiles):
        start = core_end[-1] if core_end else setup
        if i >= acc_stages:  # the buffer is free once the epilogue of tile i - acc_stages is done
            start = max(start, epi_end[i - acc_stages])
        v5_core.append((start, mainloop, f"main loop t{i} -> buf {i % acc_stages}", "mma"))
        core_end.append(start + mainloop)
        begin = max(core_end[i], epi_end[-1] if epi_end else 0.0)
        v5_epi.append((begin, epilogue, f"epilogue t{i}", "epilogue"))
        epi_end.append(begin + epilogue)
    return timeline(
        [
            ("V4: tensor core", v4_core),
            ("V4: epilogue warps", v4_epi),
            ("V5: tensor core", v5_core),
            ("V5: epilogue warps", v5_epi),
        ],
        f"{tiles} tiles on one SM: V4 done at {t:.1f}, V5 at {epi_end[-1]:.1f} (schematic units)",
    )


def subtile_epilogue(sub_tiles: int = 6, read: float = 1.0, store: float = 1.6, buffers: int = 2):
    """The epilogue in column sub-tiles: the warpgroup reads sub-tile j (TMEM or registers), converts
    it into staging buffer j % buffers and hands it to a TMA store it does not wait for; a buffer is
    rewritten only after the store that last read it has finished reading."""
    warps, stores, store_end = [], [], []
    t = 0.0
    for j in range(sub_tiles):
        if j >= buffers:
            t = max(t, store_end[j - buffers])
        warps.append((t, read, f"sub {j} -> buf {j % buffers}", "epilogue"))
        t += read
        begin = max(t, store_end[-1] if store_end else 0.0)
        stores.append((begin, store, f"store {j}", "store"))
        store_end.append(begin + store)
    return timeline(
        [("epilogue warpgroup", warps), ("TMA store unit", stores)],
        f"Sub-tiled epilogue with {buffers} staging buffers: stores overlap the next sub-tile's read",
    )


def multicast_pair(block_m: int, block_n: int, block_k: int):
    """Two CTAs of a cluster computing vertically adjacent block_m x block_n tiles need the same B
    tile: each loads its own A tile and one half of B, multicast by TMA into both CTAs."""
    fig, ax = plt.subplots(figsize=(10, 3.8))
    colors = [COLORS["a"], COLORS["peer"]]
    for r in range(2):
        y = 1.2 - 1.2 * r
        ax.add_patch(Rectangle((0, y), 1, 1, facecolor=colors[r], edgecolor="black"))
        ax.text(
            0.5,
            y + 0.5,
            f"A tile of CTA {r}\n{block_m} x {block_k}\n(loaded by CTA {r})",
            ha="center",
            va="center",
            fontsize=8,
        )
        for half in range(2):
            ax.add_patch(
                Rectangle(
                    (1.6 + 1.1 * half, y),
                    1,
                    1,
                    facecolor=colors[half],
                    edgecolor="black",
                    hatch="//" if half != r else None,
                )
            )
            ax.text(
                2.1 + 1.1 * half,
                y + 0.5,
                f"B rows {half * block_n // 2}..{(half + 1) * block_n // 2 - 1}\nloaded by CTA {half}",
                ha="center",
                va="center",
                fontsize=8,
            )
        ax.text(
            4.1,
            y + 0.5,
            f"CTA {r}'s shared memory for one K block:\nits A tile + the whole B tile\n"
            f"C tile rows {r * block_m}..{(r + 1) * block_m - 1} of the pair",
            va="center",
            fontsize=9,
        )
    ax.set_xlim(0, 7.5)
    ax.set_ylim(-0.1, 2.3)
    ax.axis("off")
    ax.set_title("TMA multicast (Hopper V6): hatched halves were written by the peer CTA's load")
    fig.tight_layout()
    return fig


# -- V8: the packed int4 tile ---------------------------------------------------------------------


def packed_tile(thread: int, held: dict[int, list[dict]]):
    """Where one thread's int4 values sit in a 64 x 128 weight tile (left) and in the TMA box of
    packed words that carries the tile (right). ``held``: half -> the rows of
    ``_helpers.thread_words`` (row, column, word j of each nibble), computed from a quantized weight
    and checked against it."""
    word_colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [2, 1.1]})
    for warp in range(4):  # the four warps of the warpgroup own 16 rows each
        left.add_patch(Rectangle((0, 48 - 16 * warp), 128, 16, facecolor=["#f7f7f7", "#e8e8e8"][warp % 2]))
        left.text(-2, 56 - 16 * warp, f"warp {warp}", ha="right", va="center", fontsize=8)
    for step in range(9):
        left.axvline(16 * step, color="grey", lw=0.8 if step % 4 else 1.8)
    for rows in held.values():
        for r in rows:
            left.add_patch(Rectangle((r["column"], 63 - r["row"] % 64), 1, 1, facecolor=word_colors[r["word j"]]))
    for step in range(8):
        left.text(16 * step + 8, 65, f"K step {step}", ha="center", fontsize=7)
    left.text(32, 69, "half 0", ha="center", fontsize=9)
    left.text(96, 69, "half 1", ha="center", fontsize=9)
    left.set_xlim(-14, 128)
    left.set_ylim(0, 72)
    left.set_xticks([0, 64, 128])
    left.set_yticks([])
    left.set_xlabel("K columns of the tile (one scale group: 128)")
    left.set_title(f"the weight tile, 64 rows x 128 columns: thread {thread}'s 64 values", fontsize=10)
    for box_row in range(16):  # the box: 16 rows of 64 words, halves 0 and 1 one after the other
        right.add_patch(Rectangle((0, 15 - box_row), 64, 1, facecolor="#f7f7f7", edgecolor="#dddddd", lw=0.3))
    for half in held:
        for j in range(4):
            index = (half * 128 + thread) * 4 + j
            right.add_patch(
                Rectangle((index % 64, 15 - index // 64), 1, 1, facecolor=word_colors[j], edgecolor="black", lw=0.3)
            )
    right.axhline(8, color="black", lw=1.2)
    right.text(65, 12, "half 0", va="center", fontsize=8)
    right.text(65, 4, "half 1", va="center", fontsize=8)
    right.set_xlim(0, 72)
    right.set_ylim(0, 16)
    right.set_xticks([0, 32, 64])
    right.set_yticks([])
    right.set_xlabel("int32 words of a box row (the box: [16, 64] words = 4 KiB)")
    right.set_title(f"the TMA box [16, 64] words: thread {thread}'s 4 words a half", fontsize=10)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c) for c in word_colors]
    left.legend(handles, [f"word {j} (K step 4h + {j})" for j in range(4)], fontsize=7, loc="lower right", ncol=4)
    fig.tight_layout()
    return fig
