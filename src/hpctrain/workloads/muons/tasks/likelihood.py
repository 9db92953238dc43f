"""The muon models trained by likelihood alone: the flow (`muon_flow`) and the multiplicity alone
(`muon_multiplicity`). Nothing random in their steps: an exact resume needs no task state beyond the flag that
the standardisation was set."""

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
from hpctrain.workloads.muons.tasks.task_base import MuonTaskBase


class MuonFlowTask(MuonTaskBase[MuonFlowRun]):
    """Bundles by likelihood: NB multiplicity given the primary, each muon from the conditional spline flow
    given (primary, multiplicity); one optimizer ("main"). Loss = multiplicity_weight x NB NLL per event + the
    muons' NLL per muon. Nothing random in the step: an exact resume needs no task state."""

    def __init__(self, cfg: MuonFlowRun, env: ClusterEnv) -> None:
        super().__init__(cfg, env)
        self.scaler_ready = False  # the flow's standardisation was set (checkpointed)

    def network_settings(self) -> dict[str, dict[str, Any]]:
        m = self.cfg.model
        # no global latent: muons are independent given (primary, multiplicity); latent_local is unused
        generator = {
            "latent_global": 0, "latent_local": 1, "hidden": m.hidden, "mult_hidden": list(m.multiplicity.hidden),
            "cap": muon_cap(self.cfg), "isotropic": False, "head": "flow", "flow_bins": m.flow_bins,
        }  # fmt: skip
        return {"generator": generator}

    def build_modules(self) -> dict[str, nn.Module]:
        return {"generator": Generator(**self.network_settings()["generator"])}

    def compile_setting(self, name: str) -> str:
        own = self.cfg.model.compile.generator
        return super().compile_setting(name) if own is None else own

    def state_dict(self) -> dict[str, Any]:
        return {"scaler_ready": self.scaler_ready}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler_ready = bool(state.get("scaler_ready", False))

    def _losses(self, generator: nn.Module, b: MuonBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(NB NLL per event, muon NLL per muon), each a mean over the batch."""
        index = event_index(b.counts, b.num_muons)
        no_latent = b.primaries.new_zeros((len(b), 0))
        return likelihood_losses(generator, b.primaries, b.counts, index, b.muons, no_latent)

    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        raw: Generator = ctx.raw_modules["generator"]  # type: ignore[assignment]
        if not self.scaler_ready:
            raw.fit_scalers(micro_batches[0].data.muons)  # once; saved with the generator's buffers
            self.scaler_ready = micro_batches[0].data.num_muons >= 2
        generator = ctx.modules["generator"]
        zero = torch.zeros((), device=ctx.device)
        total, mult_total, muon_total = zero, zero, zero
        for i, mb in enumerate(micro_batches):
            with ctx.no_sync("generator", last=i == len(micro_batches) - 1):
                with ctx.autocast():
                    mult, muon = self._losses(generator, mb.data)
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
        mult, muon = self._losses(ctx.raw_modules["generator"], batch)
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
