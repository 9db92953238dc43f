"""The muon models trained by likelihood alone: the bundle model (`muon_flow`) and the multiplicity alone
(`muon_multiplicity`). muon_flow's step draws its latents' noise from the task's own generator (StepRng, saved
in the checkpoint with the flag that the standardisation was set): an exact resume."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.task import MicroBatch, StepOutput, UpdateContext
from hpctrain.workloads.muons.evaluation.evaluate import evaluate_after_training
from hpctrain.workloads.muons.events.batch import MuonBatch
from hpctrain.workloads.muons.models.losses import likelihood_losses
from hpctrain.workloads.muons.models.networks import Generator, MultiplicityHead, event_index
from hpctrain.workloads.muons.spec import MuonFlowRun, MuonMultiplicityRun, muon_cap
from hpctrain.workloads.muons.tasks.base import MuonTaskBase, StepRng

EVAL_SEED = 7_654_321  # the evaluation's latent noise: its own fixed stream, the same at every evaluation


class MuonFlowTask(MuonTaskBase[MuonFlowRun]):
    """Bundles by likelihood: NB multiplicity given the primary; with `model.latent`, an event latent from a
    prior given (primary, N), learned through an encoder's posterior; the muons from the conditional spline
    flow given (primary, N, latent), the leading muon first (`model.leading_muon`). One optimizer ("main").
    Loss = multiplicity_weight x NB NLL per event + the muons' negative ELBO per muon (their NLL and the
    events' KL from the prior, spread over the batch's muons; without a latent, their NLL)."""

    def __init__(self, cfg: MuonFlowRun, env: ClusterEnv) -> None:
        super().__init__(cfg, env)
        self.scaler_ready = False  # the flow's standardisation was set (checkpointed)
        self._rng = StepRng(cfg.run.seed, env.rank)
        self._eval_rng: torch.Generator | None = None

    def network_settings(self) -> dict[str, dict[str, Any]]:
        m = self.cfg.model
        latent = m.latent
        # without a latent the muons are independent given (primary, multiplicity); latent_local is unused
        generator = {
            "latent_global": latent, "latent_local": 1, "hidden": m.hidden, "mult_hidden": list(m.multiplicity.hidden),
            "cap": muon_cap(self.cfg), "isotropic": False, "head": "flow", "flow_bins": m.flow_bins,
        }  # fmt: skip
        if latent or m.leading_muon:  # keys only where set: runs of the older model keep their settings
            generator.update(latent_encoder=latent > 0, latent_prior=latent > 0, leading=m.leading_muon)
        return {"generator": generator}

    def build_modules(self) -> dict[str, nn.Module]:
        return {"generator": Generator(**self.network_settings()["generator"])}

    def compile_setting(self, name: str) -> str:
        own = self.cfg.model.compile.generator
        return super().compile_setting(name) if own is None else own

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"scaler_ready": self.scaler_ready}
        rng = self._rng.state()
        if rng is not None:
            state["rng"] = rng
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler_ready = bool(state.get("scaler_ready", False))
        self._rng.load(state.get("rng"))

    def _losses(
        self, generator: nn.Module, b: MuonBatch, rng: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(NB NLL per event, muon NLL per muon (with a latent: the negative ELBO)), each a mean over the batch;
        the posterior's noise from `rng`."""
        index = event_index(b.counts, b.num_muons)
        noise = torch.randn((len(b), self.cfg.model.latent), device=b.primaries.device, generator=rng).to(
            b.primaries.dtype
        )
        return likelihood_losses(generator, b.primaries, b.counts, index, b.muons, noise)

    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        raw: Generator = ctx.raw_modules["generator"]  # type: ignore[assignment]
        if not self.scaler_ready:
            first = micro_batches[0].data
            raw.fit_scalers(first.muons, first.counts)  # once; saved with the generator's buffers
            self.scaler_ready = first.num_muons >= 2
        generator = ctx.modules["generator"]
        rng = self._rng.get(ctx.device)
        zero = torch.zeros((), device=ctx.device)
        total, mult_total, muon_total = zero, zero, zero
        for i, mb in enumerate(micro_batches):
            with ctx.no_sync("generator", last=i == len(micro_batches) - 1):
                with ctx.autocast():
                    mult, muon = self._losses(generator, mb.data, rng)
                loss = self.cfg.model.multiplicity_weight * mult + muon
                ctx.backward(loss * mb.weight)
            total = total + loss.detach() * mb.weight
            mult_total = mult_total + mult.detach() * mb.weight
            muon_total = muon_total + muon.detach() * mb.weight
        ctx.optimizer_step("main")
        samples = sum(mb.samples for mb in micro_batches)
        muons = sum(mb.data.num_muons for mb in micro_batches)
        metrics = {"multiplicity_nll": mult_total, "muon_nll": muon_total}
        return StepOutput(total, metrics, samples, extra_counts={"events": samples, "muons": muons})

    def eval_step(self, batch: MuonBatch, ctx: UpdateContext) -> dict[str, torch.Tensor]:
        if self._eval_rng is None or self._eval_rng.device != ctx.device:
            self._eval_rng = torch.Generator(device=ctx.device)
        # the same noise for the same batch, every evaluation
        self._eval_rng.manual_seed(EVAL_SEED + len(batch))
        mult, muon = self._losses(ctx.raw_modules["generator"], batch, self._eval_rng)
        n, m = float(len(batch)), float(batch.num_muons)
        return {
            "multiplicity_nll_sum": mult.double() * n,
            "muon_nll_sum": muon.double() * m,
            "count": torch.tensor(n, dtype=torch.float64),
            "muon_count": torch.tensor(m, dtype=torch.float64),
        }

    def finish_eval(self, sums: dict[str, float]) -> dict[str, float]:
        mult = sums.get("multiplicity_nll_sum", 0.0) / max(sums.get("count", 1.0), 1.0)
        muon = sums.get("muon_nll_sum", 0.0) / max(sums.get("muon_count", 1.0), 1.0)
        return {"val_multiplicity_nll": mult, "val_muon_nll": muon, "val_loss": mult + muon}

    def after_training(self, modules: dict[str, nn.Module], step: int) -> None:
        """The evaluate table on data.val_paths, as for muon_wgan."""
        if self.cfg.data.val_paths:
            evaluate_after_training(self.cfg, modules, step, self.run_dir)


class MuonMultiplicityTask(MuonTaskBase[MuonMultiplicityRun]):
    """NB(mu, r) of the muon count given the primary, trained by likelihood (one optimizer, 'main')."""

    def network_settings(self) -> dict[str, dict[str, Any]]:
        return {
            "multiplicity": {"hidden": list(self.cfg.model.multiplicity.hidden), "cap": muon_cap(self.cfg)}
        }

    def build_modules(self) -> dict[str, nn.Module]:
        return {"multiplicity": MultiplicityHead(**self.network_settings()["multiplicity"])}

    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        head = ctx.modules["multiplicity"]
        total = torch.zeros((), device=ctx.device)
        for i, mb in enumerate(micro_batches):
            b = mb.data
            with ctx.no_sync("multiplicity", last=i == len(micro_batches) - 1):
                with ctx.autocast():
                    log_mu, log_r = head(b.primaries)
                nll = MultiplicityHead.nll(log_mu.float(), log_r.float(), b.counts).mean()
                ctx.backward(nll * mb.weight)
            total = total + nll.detach() * mb.weight
        ctx.optimizer_step("main")
        samples = sum(mb.samples for mb in micro_batches)
        return StepOutput(total, {}, samples, extra_counts={"events": samples})

    def eval_step(self, batch: MuonBatch, ctx: UpdateContext) -> dict[str, torch.Tensor]:
        log_mu, log_r = ctx.raw_modules["multiplicity"](batch.primaries)
        nll = MultiplicityHead.nll(log_mu.float(), log_r.float(), batch.counts)
        mean = log_mu.float().exp()
        err = (torch.log10(mean + 1.0) - torch.log10(batch.counts.float() + 1.0)).abs()
        return {
            "loss_sum": nll.sum().double(),
            "log10_mean_abs_err_sum": err.sum().double(),
            "count": torch.tensor(float(len(batch)), dtype=torch.float64),
        }
