"""What the report's figures say and where they draw it (issue 31, item 4), read from the matplotlib Figure objects
after a draw: titles by what a loss is, no panel for a constant, readable labels with units, hop labels that never
overprint, log axes for losses spanning more than 20x, figures (W1, KS) outside the data, triangles where a ratio
panel clips, x ranges that end at the data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpctrain.track.report.data import RunData
from hpctrain.track.report.generic import plot_distributions, plot_scalars, plot_throughput
from hpctrain.workloads.muons.report import binned_panels, groups


def run_data(
    path: Path, records: list[dict[str, Any]], hops: list[dict[str, Any]] | None = None,
    model: str = "muon_flow", evaluation: dict[str, Any] | None = None,
) -> RunData:  # fmt: skip
    return RunData(path, records, hops or [], {}, evaluation or {}, {"model": {"type": model}})


def flow_records(total: int = 200, loss_start: float = 30.0) -> list[dict[str, Any]]:
    """A muon_flow run's records: a loss falling from `loss_start` to ~0.5, the hardware monitor's keys (the
    workers at 0 and their CPU at 0 the whole run, the memory growing)."""
    out = []
    for step in range(10, total + 1, 10):
        loss = 0.5 + (loss_start - 0.5) * math.exp(-step / 20)
        out.append(
            {"step": step, "lr": 1e-3, "loss": loss, "loss_mean": loss, "muon_nll": loss * 0.8,
             "multiplicity_nll": loss * 0.2, "grad_norm_generator": 1 + 1 / step, "rss_gb": 1 + step / 1000,
             "workers": 0.0, "workers_cpu_pct": 0.0, "gpu0_util_pct": 50.0 + step % 9,
             "gpu1_util_pct": 60.0 + step % 7, "updates_per_s": 3.0}
        )  # fmt: skip
    return out


def visible_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.get_visible()]


def test_a_flow_models_loss_is_no_critic_loss(tmp_path: Path) -> None:
    data = run_data(tmp_path, flow_records())
    titles = [ax.get_title() for ax in visible_axes(plot_scalars(data, groups(data)).figure)]
    assert titles[0] == "loss: negative log-likelihood (multiplicity + muons)"
    assert not any("critic" in t.lower() for t in titles), titles
    wgan = run_data(tmp_path, flow_records(), model="muon_wgan")
    assert any("critic loss" in g.title for g in groups(wgan))  # the WGAN's loss is one


def test_constant_panels_are_one_note_and_keys_read_as_words_with_units(tmp_path: Path) -> None:
    data = run_data(tmp_path, flow_records())
    image = plot_scalars(data, groups(data))
    axes = visible_axes(image.figure)
    titles = [ax.get_title() for ax in axes]
    # workers and their CPU at 0 the whole run: no panel, one mention under the title and in the caption
    assert not any("worker" in t.lower() for t in titles), titles
    note = "DataLoader worker processes 0; DataLoader workers' CPU use 0 % of one core"
    assert note in image.figure.get_suptitle().replace("\n", " ")
    assert note in image.caption
    # readable titles and units, never a raw key (`rss gb` over `rss_gb`)
    memory = next(ax for ax in axes if ax.get_title() == "process memory (RSS)")
    assert memory.get_ylabel() == "resident memory [GB]"
    gpu = next(ax for ax in axes if ax.get_title() == "GPU utilisation")  # both GPUs on one axis
    assert gpu.get_ylabel() == "utilisation [%]"
    assert [line.get_label() for line in gpu.get_lines()] == [
        "GPU 0 (gpu0_util_pct)",
        "GPU 1 (gpu1_util_pct)",
    ]
    for ax in axes:
        assert "_" not in ax.get_title() and "_" not in ax.get_ylabel(), (ax.get_title(), ax.get_ylabel())
        assert "[" in ax.get_ylabel() or ax.get_title() == "gradient norm (before clipping)", ax.get_ylabel()


@pytest.mark.parametrize(("start", "scale"), [(30.0, "log"), (2.0, "linear")])
def test_a_loss_over_more_than_20x_gets_a_log_axis(tmp_path: Path, start: float, scale: str) -> None:
    data = run_data(tmp_path, flow_records(loss_start=start))  # 30 -> 0.5: 60x; 2 -> 0.5: 4x
    loss = visible_axes(plot_scalars(data, groups(data)).figure)[0]
    assert loss.get_yscale() == scale


def hops(firsts: list[int]) -> list[dict[str, Any]]:
    """chain.json hops starting at these updates, each with a job id; every third accepted a changed key."""
    out = []
    for i, first in enumerate(firsts):
        hop: dict[str, Any] = {
            "hop": i,
            "job_id": str(9000000 + i),
            "start": 1000.0 * i,
            "first_update": first,
        }
        if i % 3 == 2:
            hop["allowed_changes"] = {"data.num_workers": [0, 2]}
        out.append(hop)
    return out


def extents(fig: Any, artists: list[Any]) -> list[Any]:
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


@pytest.mark.parametrize("firsts", [[0, 100], [0, *range(20, 200, 6)], [0, 5, 10, 15, 190, 195]])
def test_hop_labels_never_overprint(tmp_path: Path, firsts: list[int]) -> None:
    data = run_data(tmp_path, flow_records(), hops(firsts))
    image = plot_scalars(data, groups(data))
    fig = image.figure
    fig.canvas.draw()  # the final layout (constrained, legends outside)
    ax = visible_axes(fig)[0]
    labels = [t for t in ax.texts if t.get_text().startswith("hop ")]
    boxes = extents(fig, labels)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), [t.get_text() for t in labels]
    frame, title = ax.get_window_extent(), ax.title.get_window_extent()
    assert all(frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 for box in boxes)  # not into the legend
    assert all(
        frame.y1 <= box.y0 and box.y1 <= title.y0 for box in boxes
    )  # above the curves, under the title
    assert labels[0].get_text() == "hop 2, job 9000001"  # the first change of hop is always labelled
    left_out = len(firsts) - 1 - len(labels)
    assert (f"{left_out} hop labels left out" in image.caption) == (left_out > 0)
    if len(firsts) == 2:
        assert left_out == 0


def test_per_hop_bars_label_a_few_hops_counted_from_1(tmp_path: Path) -> None:
    from hpctrain.track.report.generic import plot_time_shares

    data = run_data(tmp_path, flow_records(), hops([0, *range(20, 200, 6)]))  # 31 hops
    for image, panels in ((plot_throughput(data), 1), (plot_time_shares(data), 2)):
        fig = image.figure
        fig.canvas.draw()
        per_hop = [ax for ax in visible_axes(fig) if ax.get_xlabel() == "job hop [from 1]"]
        assert len(per_hop) == panels
        for ax in per_hop:
            low, high = ax.get_xlim()
            shown = [t for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
            assert 2 <= len(shown) <= 13 and min(float(t.get_text()) for t in shown) >= 1
            boxes = extents(fig, shown)
            assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def hist(edges: np.ndarray, centre: float, events: int, rng: np.random.Generator) -> np.ndarray:
    return np.histogram(rng.normal(centre, 0.5, events), edges)[0].astype(float)


def spec(rng: np.random.Generator) -> dict[str, Any]:
    """A feature's histograms on edges that run far past the data; generated above true at high x, single counts
    at the lower left (where a box of figures in a corner covered them)."""
    edges = np.linspace(0.0, 10.0, 51)  # data only in ~0.5..4.5 (and the first bin from 0 on a log axis)
    true = hist(edges, 2.0, 4000, rng)
    generated = hist(edges, 2.6, 4000, rng)
    true[0] = generated[0] = 0.0  # the data from 0.2 on
    true[1:6], generated[1:6] = np.maximum(true[1:6], 2.0), 1.0  # single counts at the lower left
    return {"edges": edges.tolist(), "true": true.tolist(), "generated": generated.tolist(), "w1": 0.3,
            "ks": 0.2}  # fmt: skip


def distributions_run(path: Path) -> RunData:
    rng = np.random.default_rng(3)
    energy = spec(rng)
    evaluation = {
        "distributions": {"energy": {"bins": energy["edges"], "true": energy["true"],
                                     "generated": energy["generated"], "label": "muon energy", "unit": "GeV",
                                     "w1": 0.3, "ks": 0.2}},
        "binned": {"energy": [{"range": [lo, lo + 1], "events_true": 4000, "events_generated": 4000,
                               "features": {"energy": spec(rng)}} for lo in (3, 4)]},
    }  # fmt: skip
    return run_data(path, flow_records(), evaluation=evaluation)


def points(ax: Any) -> np.ndarray:
    """Display coordinates of every data point drawn on `ax` (lines and the error bars' points)."""
    xy = [np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float) for line in ax.get_lines()]
    xy = [p[np.isfinite(p).all(axis=1) & (p[:, 1] > 0)] for p in xy if len(p)]  # 0: no point on a log axis
    shown = ax.transData.transform(np.concatenate(xy)) if xy else np.zeros((0, 2))
    return shown[np.isfinite(shown).all(axis=1)]


def figures(data: RunData) -> list[Any]:
    return [image.figure for image in plot_distributions(data) + binned_panels(data)]


def test_w1_and_legends_cover_no_data(tmp_path: Path) -> None:
    data = distributions_run(tmp_path)
    for fig in figures(data):
        fig.canvas.draw()
        for ax in visible_axes(fig):
            if ax.get_ylim() != (0.0, 2.0):  # not a ratio panel
                assert "W1 0.3" in ax.get_title() and "KS 0.2" in ax.get_title()
            covering = list(ax.texts) + ([ax.get_legend()] if ax.get_legend() else [])
            inside = points(ax)
            for box in extents(fig, covering):
                covered = (inside[:, 0] >= box.x0) & (inside[:, 0] <= box.x1)
                covered &= (inside[:, 1] >= box.y0) & (inside[:, 1] <= box.y1)
                assert not covered.any(), ax.get_title()


def test_ratio_panels_mark_the_bins_above_their_top(tmp_path: Path) -> None:
    data = distributions_run(tmp_path)
    binned = data.evaluation["binned"]["energy"]
    fig = binned_panels(data)[0].figure
    for col, panel in enumerate(binned):
        feature = panel["features"]["energy"]
        edges, true, generated = (np.asarray(feature[k]) for k in ("edges", "true", "generated"))
        with np.errstate(divide="ignore", invalid="ignore"):
            above = (true > 0) & (generated > 0) & (generated / true > 2)
        ax, ratio_ax = fig.axes[col], fig.axes[len(binned) + col]
        assert ratio_ax.get_ylim() == (0.0, 2.0) and above.sum() >= 3
        triangles = [line for line in ratio_ax.get_lines() if line.get_marker() == "^"]
        assert len(triangles) == 1
        centres = 0.5 * (edges[1:] + edges[:-1])
        assert np.allclose(triangles[0].get_xdata(), centres[above])
        assert all(0 < y <= 2 for y in triangles[0].get_ydata())  # inside the panel, at its top
        outside = (true == 0) & (generated > 0)
        assert f"{above.sum() + outside.sum()} bins at the ratio's top" in ax.get_title()
    (dist,) = [image.figure for image in plot_distributions(data)]
    legend = dist.axes[1].get_legend()
    assert legend is not None and "gen / true above 2:" in legend.get_texts()[0].get_text()


def test_x_ranges_end_at_the_data(tmp_path: Path) -> None:
    data = distributions_run(tmp_path)
    for fig in figures(data):
        for ax in visible_axes(fig):
            if ax.get_ylim() == (0.0, 2.0):  # a ratio panel: shares its x axis
                continue
            xy = [
                np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float) for line in ax.get_lines()
            ]
            drawn = np.concatenate([p[p[:, 1] > 0, 0] for p in xy])  # the points' bin centres
            low, high = ax.get_xlim()
            # from the first to the last bin holding anything: half a bin (0.1) beyond the outermost points
            assert drawn.min() - 0.1 - 1e-9 <= low < drawn.min(), (ax.get_title(), low, drawn.min())
            assert drawn.max() < high <= drawn.max() + 0.1 + 1e-9, (ax.get_title(), high, drawn.max())
    scalars = plot_scalars(run_data(tmp_path, flow_records()), [])
    throughput = plot_throughput(run_data(tmp_path, flow_records()))
    for fig in (scalars.figure, throughput.figure):
        ax = visible_axes(fig)[0]
        assert ax.get_xlim()[1] <= 200 + 0.06 * 190  # the last record (200) and matplotlib's 5% margin


def test_generated_values_outside_the_truths_support_are_marked_in_the_ratio_panel() -> None:
    """Bins where the truth has nothing and the generator something have no ratio: a cross at the panel's top
    for each, counted with the clipped ones (shown above as points, not lost below)."""
    from hpctrain.track.report.generic import ratio_panel
    from hpctrain.track.report.panels import figure

    _, axes = figure(600, 400, 2, 1, sharex=True)
    edges = np.arange(7, dtype=float)
    true, generated = np.array([0, 5, 10, 8, 0, 0.0]), np.array([3, 5, 30, 8, 0, 2.0])
    marked = ratio_panel(axes[0, 0], axes[1, 0], edges, true, generated)
    crosses = [line for line in axes[1, 0].get_lines() if line.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [0.5, 5.5]
    assert all(0 < y <= 2 for y in crosses[0].get_ydata())
    assert marked == 3  # two crosses and the bin at 30 / 10, above 2
