"""Config of the muon workload (pydantic only: importable on login nodes without torch)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hpctrain.config.schema import (
    MAY_CHANGE,
    CompileMode,
    ConfigBase,
    DataConfigBase,
    ModelConfigBase,
    Section,
    as_compile_mode,
)
from hpctrain.workloads.registry import WorkloadSpec

DEFAULT_MUON_CAP = 100_000  # sampled muons per event when neither the model nor the data sets a cap
# events generated at once by default: the fastest on CPU measured (bench/muon_sample.py: 1,024 events per
# batch ~1.5x 4,096 and ~2.4x 65,536, in a third of the memory); a GPU wants more (--batch-size)
SAMPLE_BATCH = 1024
# the classifier two-sample test's defaults (evaluation/two_sample.py; here so that verbs.py's options need no
# NumPy): 2 folds of 50 k pairs are 2 fits of 50 k rows each, well under a minute of 2 cores (5 folds: 2.5x
# the rows fitted); one null replicate, as the band's edge is at least 0.5 + 3 sigma anyway
JUDGE_FOLDS = 2
JUDGE_NULL_REPLICATES = 1
# `hpctrain evaluate`'s defaults: the events a verdict ("met", "within null") needs (a table of fewer is a smoke
# check: evaluation/verdict.py) and the seed, which the end-of-training check shares so that its command repeats it
EVALUATE_EVENTS = 10_000
EVALUATE_SEED = 12345
# best.pt of a generator follows the classifier AUC of the evaluation's judge (tasks/base.py), lower better
GENERATOR_BEST_METRIC = "val_auc"

# events of an HDF5 file read at once (its "row group"), unless data.hdf5_unit_events says
UNIT_EVENTS = 65536


class MuonData(DataConfigBase):
    """Muon-bundle events from Parquet/HDF5 files (layout detected per file; see docs/data.md)."""

    type: Literal["muons"] = "muons"
    input_paths: ClassVar[tuple[str, ...]] = ("paths", "val_paths")
    paths: list[str] = Field(
        default_factory=list,
        description="Training files: local paths, globs or folders, or remote URIs (pelican://, osdf:///, "
        "https://), indexed from their Parquet footers and staged to node-local scratch just ahead of use.",
    )
    val_paths: list[str] = Field(
        default_factory=list, description="Validation files (empty = no validation)."
    )
    report_first_batch: bool = Field(
        False,
        description="Say, once per file and process, a summary of the first non-empty events read from it "
        "(counts, mean energies, first ids): proof that the data changes across files.",
        json_schema_extra=MAY_CHANGE,
    )
    memory_cache_mb: int = Field(
        0,
        ge=0,
        description="Keep up to this many MB of Parquet file bytes in memory per process (an LRU, one per "
        "DataLoader worker): for few files read over many epochs. 0 = off.",
        json_schema_extra=MAY_CHANGE,
    )
    max_muons_per_batch: int = Field(
        0,
        ge=0,
        description="Cut a batch into micro-batches of whole events with at most this many muons each; their "
        "gradients add up to one update (0 = no cap).",
    )
    max_muons_per_event: int = Field(
        0,
        ge=0,
        description="Skip events with more muons (0 = use max_muons_per_batch; both 0 = keep all).",
    )
    outliers_dir: str | None = Field(
        None,
        description="Write the skipped huge events here (Parquet, current layout, plus source_file and "
        "source_row), under names that never overwrite earlier runs; first epoch only.",
        json_schema_extra=MAY_CHANGE,
    )
    drop_empty_events: bool = Field(False, description="Remove events without muons.")
    on_bad_file: Literal["fail", "skip"] = Field(
        "fail",
        description="A truncated or corrupt file stops the run (fail) or is skipped and listed in "
        "<run folder>/bad_files.txt (skip).",
        json_schema_extra=MAY_CHANGE,
    )
    on_bad_event: Literal["fail", "skip"] = Field(
        "fail",
        description="An event with a zero, negative or non-finite energy or mass (or a non-finite value) "
        "stops the run naming file and row (fail) or is skipped and counted in the log (skip).",
        json_schema_extra=MAY_CHANGE,
    )
    shuffle_window: int = Field(
        8192,
        ge=1,
        description="Events are shuffled within chunks of at least this many events (whole row "
        "groups); bigger mixes better and holds more in memory.",
    )
    prefetch_batches: int = Field(
        0,
        ge=0,
        description="Ready batches kept ahead by a background thread (0 = none).",
        json_schema_extra=MAY_CHANGE,
    )
    read_ahead: bool | Literal["auto"] = Field(
        "auto",
        description="With num_workers=0 and local files: one background thread decodes the next work item's "
        "row groups while this one is gathered and trained on (Arrow's decode releases the GIL). auto: on "
        "when CUDA is available (the CPU is idle during a GPU step), off on CPU, where torch's threads use "
        "every core and the thread would compete with them.",
        json_schema_extra=MAY_CHANGE,
    )
    max_events: int = Field(0, ge=0, description="Use only the first N events of the files (0 = all).")
    hdf5_unit_events: int = Field(
        UNIT_EVENTS,
        ge=1,
        description="Events read at once from an HDF5 file (its 'row group' for order and memory).",
    )

    @model_validator(mode="after")
    def _caps(self) -> MuonData:
        if self.max_muons_per_batch and self.max_muons_per_event > self.max_muons_per_batch:
            raise ValueError(
                f"max_muons_per_event ({self.max_muons_per_event}) exceeds max_muons_per_batch "
                f"({self.max_muons_per_batch}): such an event could never fit a micro-batch"
            )
        return self

    @property
    def event_muon_cap(self) -> int:
        """The effective per-event limit (0 = none)."""
        return self.max_muons_per_event or self.max_muons_per_batch


# ---- models (pydantic only; the tasks live in task.py) -----------------------------------------------------


class MultiplicitySettings(Section):
    """The negative-binomial multiplicity head (used alone by muon_multiplicity, inside the generator by
    muon_wgan)."""

    hidden: list[int] = Field([64, 128, 64], description="Widths of the hidden layers (ELU).")
    max_muons_per_event: int = Field(
        0,
        ge=0,
        description="Cap on sampled multiplicities (0 = data.max_muons_per_event or max_muons_per_batch; "
        "both 0 = 100000), so generation cannot run out of memory.",
    )


class CompileSettings(Section):
    generator: CompileMode | None = Field(
        None, description="torch.compile mode of the generator (true = default; null = train.compile)."
    )
    critic: CompileMode | None = Field(
        None,
        description="torch.compile mode of the critic (null = train.compile). With lambda_gp > 0 the gradient "
        "penalty is compiled too: its input gradient is taken by torch.func.grad inside the compiled code (no "
        "double backward through compiled code, which torch does not support).",
    )

    @field_validator("generator", "critic", mode="before")
    @classmethod
    def _bools(cls, value: Any) -> Any:
        return value if value is None else as_compile_mode(value)


class AdaptiveCriticSettings(Section):
    """Critic updates per generator update tuned by the critic's Wasserstein estimate (averaged over ranks, so
    every rank takes the same number of steps): one more while it lags, one fewer while it dominates."""

    min_steps: int = Field(1, ge=1, description="Fewest critic updates per generator update.")
    max_steps: int = Field(10, ge=1, description="Most critic updates per generator update.")
    lag_below: float = Field(
        0.05, description="A Wasserstein estimate below this: the critic cannot tell real from fake: +1 step."
    )
    dominate_above: float = Field(
        2.0, description="A Wasserstein estimate above this: the critic dominates the generator: -1 step."
    )

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveCriticSettings:
        if self.min_steps > self.max_steps or self.lag_below >= self.dominate_above:
            raise ValueError("need min_steps <= max_steps and lag_below < dominate_above")
        return self


class MuonWGANConfig(ModelConfigBase):
    """Conditional WGAN-GP generating muon bundles (see docs/muons.md)."""

    type: Literal["muon_wgan"] = "muon_wgan"
    BEST_METRIC: ClassVar[str] = GENERATOR_BEST_METRIC
    latent_global: int = Field(32, ge=1, description="Size of the per-event latent vector.")
    latent_local: int = Field(16, ge=1, description="Size of the per-muon latent vector.")
    hidden: int = Field(256, ge=4, description="Width of the generator's event context.")
    critic_hidden: int = Field(128, ge=4, description="Width of the critic's per-muon features.")
    multiplicity: MultiplicitySettings = Field(default_factory=MultiplicitySettings)
    pooling: Literal["max", "mean", "sum"] = Field(
        "max", description="Permutation-invariant pooling of the critic's per-muon features per event."
    )
    muon_score: bool = Field(
        False,
        description="Add a per-muon critic score in which every muon of the batch counts equally (the "
        "pooled event score weighs a muon by 1/N of its event): the per-muon spectra get a direct signal.",
    )
    isotropic: bool = Field(
        False,
        description="Turn each generated muon's (x, y) about the shower axis by its own uniform azimuth (the "
        "bundle is azimuthally isotropic muon by muon, as in the synthetic truth; the generator learns r).",
    )
    muon_head: Literal["mlp", "flow"] = Field(
        "mlp",
        description="How the generator makes an event's muons from its context: mlp (an MLP on the context and "
        "a per-muon latent) or flow (a conditional spline flow: log energy, log lateral distance given it, "
        "uniform azimuth; see docs/muons.md).",
    )
    flow_bins: int = Field(8, ge=2, le=64, description="Spline bins of the flow head (muon_head=flow).")
    muon_nll_weight: float = Field(
        0.0,
        ge=0,
        description="Weight of the real muons' negative log-likelihood under the flow head in the generator "
        "loss (0 = adversarial only; needs muon_head=flow).",
    )
    likelihood_warmup: int = Field(
        0,
        ge=0,
        description="The first N updates train the generator by likelihood alone (multiplicity and flow head; "
        "no critic), so the adversarial game starts from the maximum-likelihood fit (needs muon_head=flow).",
    )
    latent_encoder: bool = Field(
        False,
        description="Train the event latent by likelihood too: the real muons' density is taken under a "
        "latent drawn from an encoder's posterior given the event's muons (a conditional VAE: the loss is the "
        "negative ELBO per muon), so the latent learns what a bundle's muons share before and during the game "
        "(needs muon_head=flow and muon_nll_weight > 0).",
    )
    critic_warmup: int = Field(
        0,
        ge=0,
        description="In the last N updates of likelihood_warmup the critic already trains against the "
        "generator's muons (the generator still learns by likelihood alone): the game then starts against a "
        "critic that knows the generator, not a random one whose first gradients push it off the fit.",
    )
    critic_steps: int = Field(5, ge=1, description="Critic updates per generator update (same batch).")
    lambda_gp: float = Field(10.0, ge=0, description="Gradient-penalty weight (0 = no penalty).")
    gp_every: int = Field(
        1, ge=1, description="Apply the penalty on every N-th critic update (counted over critic updates)."
    )
    gp_max_pairs: int = Field(
        0, ge=0, description="At most this many (real, fake) muon pairs in the penalty (0 = all)."
    )
    gp_sample_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of the batch's muon pairs (drawn at random) in the penalty (1 = all; with "
        "gp_max_pairs the smaller cap wins).",
    )
    adaptive_critic: AdaptiveCriticSettings | None = Field(
        None,
        description="Tune critic_steps while training (starting from it, within min_steps..max_steps; the "
        "number is logged as critic_steps and checkpointed). null = fixed critic_steps.",
    )
    critic_output: Literal["none", "sqrt_batch_clamp", "tanh"] = Field(
        "none",
        description="Critic score normalisation: none; the original README's score/sqrt(batch) clamped to "
        "+-critic_clamp; or critic_clamp*tanh(score/critic_clamp).",
    )
    critic_clamp: float = Field(1000.0, gt=0, description="Bound of sqrt_batch_clamp and tanh.")
    multiplicity_weight: float = Field(
        1.0, ge=0, description="Weight of the multiplicity negative log-likelihood in the generator loss."
    )
    generator_lr: float | None = Field(None, ge=0, description="Generator lr (None = optim.lr).")
    critic_lr: float | None = Field(None, ge=0, description="Critic lr (None = optim.lr).")
    compile: CompileSettings = Field(default_factory=CompileSettings, json_schema_extra=MAY_CHANGE)

    @model_validator(mode="after")
    def _flow_options(self) -> MuonWGANConfig:
        if self.muon_nll_weight > 0 and self.muon_head != "flow":
            raise ValueError(
                f"muon_nll_weight={self.muon_nll_weight:g} needs muon_head=flow (the mlp head has no density)"
            )
        if self.likelihood_warmup > 0 and self.muon_head != "flow":
            raise ValueError(
                f"likelihood_warmup={self.likelihood_warmup} needs muon_head=flow (the mlp head has no density)"
            )
        if self.latent_encoder and (self.muon_head != "flow" or self.muon_nll_weight <= 0):
            raise ValueError(
                "latent_encoder=true needs muon_head=flow and muon_nll_weight > 0 (the encoder learns from the "
                "real muons' likelihood, in the warm-up and in the game)"
            )
        if self.critic_warmup > self.likelihood_warmup:
            raise ValueError(
                f"critic_warmup={self.critic_warmup} is longer than likelihood_warmup={self.likelihood_warmup}: "
                "it counts the last updates of that warm-up"
            )
        return self


class MuonFlowConfig(ModelConfigBase):
    """Muon bundles by likelihood: the negative-binomial multiplicity given the primary, an event latent given
    (primary, multiplicity) that the bundle's muons share, and a conditional spline flow for the leading muon
    and the others under it (a conditional VAE with a flow decoder, trained on its ELBO; docs/muons.md)."""

    type: Literal["muon_flow"] = "muon_flow"
    BEST_METRIC: ClassVar[str] = GENERATOR_BEST_METRIC
    hidden: int = Field(64, ge=4, description="Width of the event context and the flow's conditioner.")
    flow_bins: int = Field(8, ge=2, le=64, description="Spline bins per muon feature.")
    latent: int = Field(
        8,
        ge=0,
        description="Size of the event latent that a bundle's muons share (what a shower's history gives all "
        "its muons: height, age), learned through an encoder's posterior with a prior given (primary, N). "
        "0 = the muons are independent given the primary and N (the model before 2026-11-28).",
    )
    leading_muon: bool = Field(
        True,
        description="Model the most energetic muon of a bundle by a density of its own and the others' energies "
        "below it (false = every muon from one density).",
    )
    multiplicity: MultiplicitySettings = Field(default_factory=MultiplicitySettings)
    multiplicity_weight: float = Field(
        1.0, ge=0, description="Weight of the multiplicity negative log-likelihood (per event) in the loss."
    )
    compile: CompileSettings = Field(default_factory=CompileSettings, json_schema_extra=MAY_CHANGE)


class MuonMultiplicityConfig(ModelConfigBase):
    """The multiplicity model alone: a negative binomial per primary, trained by likelihood."""

    type: Literal["muon_multiplicity"] = "muon_multiplicity"
    multiplicity: MultiplicitySettings = Field(default_factory=MultiplicitySettings)


class MuonRun(ConfigBase):
    """The full configuration as a muon task sees it (its type; the registry builds the full union)."""

    data: MuonData


class MuonWGANRun(MuonRun):
    model: MuonWGANConfig


class MuonMultiplicityRun(MuonRun):
    model: MuonMultiplicityConfig


class MuonFlowRun(MuonRun):
    model: MuonFlowConfig


def muon_cap(cfg: MuonWGANRun | MuonFlowRun | MuonMultiplicityRun) -> int:
    """Cap on sampled multiplicities: the model's, else the data's per-event cap, else DEFAULT_MUON_CAP."""
    return int(cfg.model.multiplicity.max_muons_per_event or cfg.data.event_muon_cap or DEFAULT_MUON_CAP)


WORKLOAD = WorkloadSpec(
    name="muons",
    models={
        "muon_wgan": MuonWGANConfig,
        "muon_flow": MuonFlowConfig,
        "muon_multiplicity": MuonMultiplicityConfig,
    },
    data=[MuonData],
)
