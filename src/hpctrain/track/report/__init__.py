"""`hpctrain report`: PNG plots and one HTML page for a run folder (no torch; matplotlib's Agg canvas).

data.py reads the run folder, generic.py draws what every run has, a workload's own `WorkloadReport` (panels.py)
adds its panels and tables, page.py renders templates/report.html.j2. The page needs no network: images are
files next to it, the style is inline.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.fsutil import atomic_path, make_folders
from hpctrain.track.report.data import RunData
from hpctrain.track.report.drawing import Drawing, draw_all
from hpctrain.track.report.generic import plot_distributions, plot_scalars, plot_throughput, plot_time_shares
from hpctrain.track.report.page import render_page
from hpctrain.track.report.panels import (
    NO_WORKLOAD,
    Image,
    ScalarGroup,
    Table,
    WorkloadReport,
)
from hpctrain.track.stages import NO_STAGES, Stages

__all__ = ["Image", "RunData", "ScalarGroup", "Table", "WorkloadReport", "write_report"]


def write_report(
    run_dir: Path,
    out: Path | None = None,
    workload: WorkloadReport = NO_WORKLOAD,
    stages: Stages = NO_STAGES,
) -> Path:
    """Write the PNGs and index.html into `out` (default <run_dir>/report); returns the HTML path. `stages`:
    a line as each part begins, the figures with an ETA."""
    data = RunData.load(run_dir)
    out = Path(out) if out is not None else data.run_dir / "report"
    make_folders(out)  # <run folder>/report by default: at most 0750, as the run folder
    stages.stage("laying out the figures", len(workload.panels) + 1, "groups")
    # What the evaluation shows first: generated vs true over all events (evaluate.json's distributions), then
    # the workload's panels in its order (muons: per bin, then the judges), then the training.
    try:
        images = [_in(image, "Generated vs true") for image in plot_distributions(data)]
        stages.advance()
        for panel in workload.panels:
            images += [_in(image, "Evaluation") for image in panel(data)]
            stages.advance()
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(
            f"{data.run_dir / 'evaluate.json'} is not what this version reads ({type(exc).__name__}: {exc}); "
            "write it again with `hpctrain evaluate`"
        ) from None
    training = [plot_scalars(data, workload.groups(data)), plot_throughput(data), plot_time_shares(data)]
    images += [_in(image, "Training") for image in training]
    tables = [table for make in workload.tables for table in make(data)]
    stages.stage(f"drawing {len(images)} figures into {out}", len(images), "figures")
    drawings = [Drawing(image.figure, out / f"{image.name}.png", _metadata(image)) for image in images]
    for image, problems in zip(images, draw_all(drawings, stages.advance)):
        image.problems = problems
    stages.stage("writing the page")
    page = out / "index.html"
    with atomic_path(page, fsync=False) as tmp:
        Path(tmp).write_text(render_page(data, images, tables, workload))
    return page


def _in(image: Image, section: str) -> Image:
    """The image under `section` on the page, unless its panel named one."""
    image.section = image.section or section
    return image


def _metadata(image: Image) -> dict[str, str]:
    """PNG text chunks naming the image and its panels (the titles of its visible axes), for readers and tests."""
    titles = [ax.get_title() for ax in image.figure.axes if ax.get_visible() and ax.get_title()]
    return {"Title": image.name, "Description": image.caption, "Comment": "panels: " + " | ".join(titles)}
