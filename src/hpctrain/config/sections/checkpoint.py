"""The `checkpoint` section: when to save, what to keep, where to resume from and what may change.

`checkpoint.resume` is parsed here, once, when the section is validated (`CheckpointConfig.resume_form`): the
readers (preflight, resume) take the parsed form; the value itself stays the string the user wrote (dumps,
config.yaml). What each form does is train/resume_forms.py's and train/resume.py's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hpctrain.config.sections.base import Section

_REWIND = re.compile(r"^(?:best|step_0*(\d+))$")


@dataclass(frozen=True)
class ResumeForm:
    """What `checkpoint.resume=<text>` asks for: auto, never, latest; rewind (best: step None, step_N: N); or a
    given checkpoint file or run folder (whether it exists is the file system's to say: train/preflight.py)."""

    kind: Literal["auto", "never", "latest", "rewind", "given"]
    text: str
    step: int | None = None  # step_N: N; best: None


def resume_form(text: str) -> ResumeForm:
    """What `checkpoint.resume=<text>` asks for; ValueError for text that names nothing."""
    if not text.strip():
        raise ValueError(
            "empty: give auto, never, latest, best, step_N, a checkpoint file or a run folder to start from"
        )
    if text in ("auto", "never", "latest"):
        return ResumeForm(text, text)  # type: ignore[arg-type]
    match = _REWIND.match(text)
    if match:
        return ResumeForm("rewind", text, int(match.group(1)) if match.group(1) else None)
    return ResumeForm("given", text)


class CheckpointConfig(Section):
    every: int = Field(
        0, ge=0, description="Also save every N updates (0 = only before stops and at the end)."
    )
    every_minutes: float = Field(
        0.0,
        ge=0,
        description="Also save every this many minutes of wall time (0 = off), so a crash, OOM or lost node "
        "costs at most that much work; rank 0's clock decides for all ranks. Stretched so that saves take at "
        "most 2% of the time (a save measured at 60 s: every 50 min). The cluster presets use 30: a save of a "
        "typical model takes seconds, i.e. < 0.5% of 30 minutes.",
    )
    keep_last: int = Field(
        2, ge=1, description="Step checkpoints kept (plus `best`); never the last good one."
    )
    resume: str = Field(
        "auto",
        description="auto (continue the run in its folder), never (start afresh; a previous run in the folder "
        "is moved to old-<time>/), latest (continue; refused when the folder holds no checkpoint), best or "
        "step_N (go back to this run's best.pt or its checkpoint of update N, once: later hops continue), or a "
        "checkpoint file or run folder to start from while the folder has none (also pelican:// or osdf://: "
        "staged to scratch and checked against its SHA-256 sidecar; a remote folder's `latest` is read).",
    )
    restart: bool = Field(
        True,
        description="true: restore everything; false: fine-tune (weights only, fresh optimizer/schedule).",
    )
    best_metric: str = Field(
        "auto",
        description="Evaluation metric that selects the `best` checkpoint (and that early stopping watches); "
        "auto: the model's own choice (muon_flow, muon_wgan: val_auc, the classifier two-sample AUC of the "
        "generator on a fixed validation subset; other models: val_loss). Changed when a run continues: the "
        "best so far was of the other metric, so best.pt is chosen afresh from the next evaluation.",
    )
    best_mode: Literal["min", "max"] = Field(
        "min", description="Whether lower or higher best_metric is better (changed: as best_metric)."
    )
    mirror_to: str | None = Field(
        None,
        description="Copy each committed checkpoint into <mirror_to>/<run name>/checkpoints/ (a folder or fsspec "
        "URL; runs sharing it keep apart).",
    )
    dir: str | None = Field(
        None,
        description="A pelican:// or osdf:// folder that holds this run's checkpoints, so that a chain can move "
        "between clusters sharing only the federation: the run writes into its local working copy "
        "(<run folder>/checkpoints, on scratch), uploads each commit there in the background (files first, "
        "`latest` last), and a hop that starts with an empty working copy downloads the latest checkpoint from "
        "there. One run's alone (claimed by its name: another run is refused). None: the run folder only.",
    )
    accept_changes: list[str] = Field(
        default_factory=list,
        description="Identity keys (or whole sections, e.g. optim) allowed to differ from the checkpoint's when "
        "this run continues, e.g. [optim.lr] for a new learning rate for the rest of the run, or "
        "[train.total_updates] for a new length that rewrites the LR schedule (extending a finished cosine run); "
        "recorded in the checkpoint and chain.json. A single key or a comma-separated string works too.",
    )

    _resume_form: ResumeForm = PrivateAttr(default=ResumeForm("auto", "auto"))

    @property
    def resume_form(self) -> ResumeForm:
        """`resume` as parsed when the section was validated (or assigned)."""
        return self._resume_form

    @field_validator("resume")
    @classmethod
    def _resume_names_something(cls, value: str) -> str:
        resume_form(value)  # a bad form is an error naming checkpoint.resume, here
        return value

    @model_validator(mode="after")
    def _parse_resume(self) -> CheckpointConfig:
        self._resume_form = resume_form(self.resume)
        return self

    @field_validator("dir")
    @classmethod
    def _remote_dir(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().startswith(("pelican://", "osdf://")):
            raise ValueError(
                f"{value!r}: give a pelican:// or osdf:// folder (local checkpoints live in the run folder: "
                "set run.out_dir)"
            )
        return value

    @field_validator("accept_changes", mode="before")
    @classmethod
    def _list_of_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value
