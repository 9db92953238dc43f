"""The pictures in docs/ show what the documents say: each one a page links is there, none is left over, and the
muon pictures come from the model configs/muons.yaml trains (images.json, written by docs/img/make_images.py,
says where each picture came from). The README's docs test runs make_images.py on its own quick-start run."""

from __future__ import annotations

import json
import re

import yaml

from tests.docs.commands import DOCS, ROOT

IMG = ROOT / "docs" / "img"


def _linked() -> set[str]:
    return {m for doc in DOCS for m in re.findall(r"\]\(img/([^)]+)\)", doc.read_text())}


def test_every_linked_picture_is_there_and_none_is_left_over() -> None:
    pictures = {p.name for p in IMG.glob("*.png")}
    assert _linked() - pictures == set(), "pictures linked but missing"
    assert pictures - _linked() == set(), "pictures no page links (remove them)"
    listed = json.loads((IMG / "images.json").read_text())["images"]
    assert set(listed) == pictures, "images.json and docs/img disagree: run docs/img/make_images.py"


def test_the_pictures_show_the_default_models() -> None:
    listed = json.loads((IMG / "images.json").read_text())["images"]
    for name, entry in listed.items():
        config = "muons.yaml" if "muons" in name else "fields.yaml"
        default = yaml.safe_load((ROOT / "configs" / config).read_text())["model"]["type"]
        assert entry["model_type"] == default, (
            f"{name} shows {entry['model_type']}, configs/{config} trains {default}"
        )
