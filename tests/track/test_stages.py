"""A long verb's stage lines (track/stages.py): one as each stage begins with the seconds since the process
began, and for a stage of known size a line with an ETA at most every `every` seconds, never at its end."""

from __future__ import annotations

import io

from hpctrain.track.stages import NO_STAGES, Stages


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_stage_and_an_eta_while_a_long_one_runs() -> None:
    out, clock = io.StringIO(), Clock()
    stages = Stages("evaluate", out, every=10.0, clock=clock, began=clock.now - 2.0)
    stages.stage("reading")
    clock.now += 3
    stages.stage("generating 4 x 100 bundles", 400, "bundles")
    for _ in range(40):  # 10 bundles a second
        clock.now += 1
        stages.advance(10)
    stages.done("evaluated")
    assert out.getvalue().splitlines() == [
        "evaluate: reading [2 s]",
        "evaluate: generating 4 x 100 bundles [5 s]",
        "evaluate: generating 4 x 100 bundles: 100/400 bundles, eta 00:30",
        "evaluate: generating 4 x 100 bundles: 200/400 bundles, eta 00:20",
        "evaluate: generating 4 x 100 bundles: 300/400 bundles, eta 00:10",
        "evaluate: evaluated [45 s]",  # no line at 400/400: the next stage's line says it
    ]


def test_counted_items_advance_the_stage_and_no_stages_says_nothing(capsys) -> None:
    out, clock = io.StringIO(), Clock()
    stages = Stages("sample", out, every=0.0, clock=clock, began=clock.now)
    stages.stage("generating 6 events", 6, "events")
    items = []
    for chunk in stages.counted(([1, 2], [3, 4], [5, 6]), len):
        clock.now += 1
        items.append(chunk)
    assert items == [[1, 2], [3, 4], [5, 6]]
    assert out.getvalue().splitlines()[1:] == [  # each chunk counted as it is handed on (none at the end)
        "sample: generating 6 events: 2/6 events, eta 00:00",
        "sample: generating 6 events: 4/6 events, eta 00:00",
    ]
    NO_STAGES.stage("x", 3, "y")
    NO_STAGES.advance(1)
    NO_STAGES.done()
    assert capsys.readouterr() == ("", "")
