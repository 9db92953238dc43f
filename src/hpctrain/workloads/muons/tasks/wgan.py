"""The conditional WGAN-GP of muon bundles (`muon_wgan`); the likelihood-trained ones are in likelihood.py.

One trainer update of muon_wgan = `critic_steps` critic updates on the batch (fresh fakes each time), then one
generator update. Fake events get the REAL multiplicities (teacher forcing): the per-muon generator learns
bundles given N, the multiplicity head learns N's distribution by likelihood, and the sampler chains the two.
Nothing in the step reads a value back to the host: shapes come from the batch (known on the CPU).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpctrain.runtime import dist
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.compile.policy import is_compiled
from hpctrain.train.task import MicroBatch, StepOutput, UpdateContext
from hpctrain.workloads.muons.evaluation.evaluate import evaluate_after_training
from hpctrain.workloads.muons.events.batch import MuonBatch
from hpctrain.workloads.muons.models.losses import (
    critic_loss,
    functional_penalty,
    generator_loss,
    gradient_penalty,
    likelihood_losses,
    normalize_scores,
    pair_muons,
    real_muon_nll,
)
from hpctrain.workloads.muons.models.networks import (
    Critic,
    Generator,
    MultiplicityHead,
    event_index,
)
from hpctrain.workloads.muons.spec import MuonWGANRun, muon_cap
from hpctrain.workloads.muons.tasks.base import MuonTaskBase, StepRng

log = logging.getLogger(__name__)
EVAL_SEED = 1_234_567  # evaluation fakes come from their own stream: comparable across evaluations


def _fork_rng(device: torch.device) -> Any:
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


@dataclass
class _Prepared:
    batch: MuonBatch
    index: torch.Tensor  # (M,) event of each muon
    weight: float
    real: torch.Tensor  # (M, 3) the real muons in the networks' scale (MuonScaler)


def gp_pair_cap(max_pairs: int, fraction: float, muons: int) -> int:
    """Most (real, fake) pairs in the gradient penalty: gp_max_pairs and gp_sample_fraction of the batch's
    muons, the smaller (0 = all)."""
    if fraction >= 1:
        return max_pairs
    share = max(1, math.ceil(fraction * muons))
    return min(max_pairs, share) if max_pairs else share


class MuonWGANTask(MuonTaskBase[MuonWGANRun]):
    def __init__(self, cfg: MuonWGANRun, env: ClusterEnv) -> None:
        super().__init__(cfg, env)
        self.critic_updates = 0  # counts critic updates over the whole run (gp_every); checkpointed
        self.updates = 0  # trainer updates over the whole run (likelihood_warmup); checkpointed
        self.critic_steps = cfg.model.critic_steps  # per generator update; tuned by model.adaptive_critic
        self.scaler_ready = False  # the generator's MuonScaler statistics were set (checkpointed)
        self._generator: Generator | None = None
        self._last_fake: torch.Tensor | None = None
        # The step's randomness (latents, GP alphas and pairs) comes from this generator, checkpointed with the
        # task: the global RNG is also drawn by data loaders and evaluation, which must not shift training.
        self._rng = StepRng(cfg.run.seed, env.rank)
        self._compiled_penalty: Callable[..., torch.Tensor] | None = None

    # ---- networks and optimizers --------------------------------------------------------------------------

    def network_settings(self) -> dict[str, dict[str, Any]]:
        m = self.cfg.model
        generator = {
            "latent_global": m.latent_global, "latent_local": m.latent_local, "hidden": m.hidden,
            "mult_hidden": list(m.multiplicity.hidden), "cap": muon_cap(self.cfg), "isotropic": m.isotropic,
            "head": m.muon_head, "flow_bins": m.flow_bins, "latent_encoder": m.latent_encoder,
        }  # fmt: skip
        critic = {"hidden": m.critic_hidden, "pooling": m.pooling, "muon_score": m.muon_score}
        return {"generator": generator, "critic": critic}

    def build_modules(self) -> dict[str, nn.Module]:
        settings = self.network_settings()
        generator = Generator(**settings["generator"])
        self._generator = generator
        return {"generator": generator, "critic": Critic(**settings["critic"])}

    def optimizer_groups(self, names: list[str]) -> dict[str, list[str]]:
        return {"generator": ["generator"], "critic": ["critic"]}

    def optimizer_overrides(self, name: str) -> dict[str, Any]:
        lr = self.cfg.model.generator_lr if name == "generator" else self.cfg.model.critic_lr
        return {} if lr is None else {"lr": lr}

    def compile_setting(self, name: str) -> str:
        m = self.cfg.model
        own = m.compile.generator if name == "generator" else m.compile.critic
        return super().compile_setting(name) if own is None else own

    def _penalty(self, ctx: UpdateContext) -> tuple[nn.Module, Callable[..., torch.Tensor] | None]:
        """The critic and the penalty function the gradient penalty goes through: with a compiled critic, the
        plain critic inside a compiled `functional_penalty` (input gradient by torch.func, so the penalty's
        backward is an ordinary one); else the critic as wrapped, by double backward."""
        critic = ctx.modules["critic"]
        if not is_compiled(critic):
            return critic, None
        if self._compiled_penalty is None:
            self._compiled_penalty = torch.compile(functional_penalty, dynamic=True)
        return ctx.raw_modules["critic"], self._compiled_penalty

    def compile_rehearsals(self) -> list[dict[str, Any]]:
        """The state now and one per later phase of the warm-up (likelihood alone, likelihood and critic, the
        adversarial updates): each phase runs other graphs."""
        now, m = self.state_dict(), self.cfg.model
        later = {u for u in (m.likelihood_warmup - m.critic_warmup, m.likelihood_warmup) if u > self.updates}
        return [now] + [{**now, "updates": u} for u in sorted(later)]

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"critic_updates": self.critic_updates, "scaler_ready": self.scaler_ready}
        state["updates"] = self.updates
        state["critic_steps"] = self.critic_steps
        rng = self._rng.state()
        if rng is not None:
            state["rng"] = rng
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic_updates = int(state.get("critic_updates", 0))
        self.updates = int(state.get("updates", 0))
        if self.cfg.model.adaptive_critic is not None:  # else critic_steps is the config's, as it may change
            self.critic_steps = int(state.get("critic_steps", self.cfg.model.critic_steps))
        self.scaler_ready = bool(state.get("scaler_ready", False))
        self._rng.load(state.get("rng"))

    def rng(self, device: torch.device) -> torch.Generator:
        """The training generator on `device`, seeded from run.seed and the rank (or the checkpoint)."""
        return self._rng.get(device)

    # ---- the step -----------------------------------------------------------------------------------------

    def _generator_noise(
        self, p: _Prepared, device: torch.device, rng: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._generator is not None
        return self._generator.noise(len(p.batch), p.batch.num_muons, device, rng)

    def _scores(self, critic: nn.Module, muons: torch.Tensor, p: _Prepared) -> torch.Tensor:
        b = p.batch
        raw = critic(muons, p.index, b.primaries, b.counts)
        return normalize_scores(raw.float(), self.cfg.model.critic_output, self.cfg.model.critic_clamp)

    def train_step(self, micro_batches: list[MicroBatch], ctx: UpdateContext) -> StepOutput:
        generator: Generator = ctx.raw_modules["generator"]  # type: ignore[assignment]
        scaler = generator.scaler
        if not self.scaler_ready:
            # once, from the first batch (then saved with the generator's buffers; DDP broadcasts rank 0's)
            generator.fit_scalers(micro_batches[0].data.muons)
            self.scaler_ready = micro_batches[0].data.num_muons >= 2  # else: try again next update
        prepared = [
            _Prepared(
                mb.data, event_index(mb.data.counts, mb.data.num_muons), mb.weight, scaler(mb.data.muons)
            )
            for mb in micro_batches
        ]
        self.updates += 1
        m = self.cfg.model
        if self.updates <= m.likelihood_warmup:
            # the critic learns the generator in the warm-up's last critic_warmup updates (before its update)
            critic_out: dict[str, torch.Tensor] = {}
            if self.updates > m.likelihood_warmup - m.critic_warmup:
                critic_out = self._critic_updates(prepared, ctx)
            metrics = {**self._likelihood_update(prepared, ctx), **critic_out}
        else:
            critic_out = self._critic_updates(prepared, ctx)
            if self.cfg.model.adaptive_critic is not None:
                critic_out["critic_steps"] = torch.tensor(float(self.critic_steps), device=ctx.device)
                self._tune_critic(critic_out["wasserstein"])
            gen_out = self._generator_update(prepared, ctx)
            metrics = {**critic_out, **gen_out}
        samples = sum(mb.samples for mb in micro_batches)
        muons = sum(p.batch.num_muons for p in prepared)
        return StepOutput(
            metrics.pop("critic_loss"), metrics, samples, extra_counts={"events": samples, "muons": muons}
        )

    def _critic_updates(self, prepared: list[_Prepared], ctx: UpdateContext) -> dict[str, torch.Tensor]:
        m = self.cfg.model
        generator, critic = ctx.modules["generator"], ctx.modules["critic"]
        rng = self.rng(ctx.device)
        zero = torch.zeros((), device=ctx.device)
        loss_total, distance, penalty = zero, zero, zero
        gp_critic, gp_function = self._penalty(ctx)
        for _ in range(self.critic_steps):
            self.critic_updates += 1
            use_gp = m.lambda_gp > 0 and self.critic_updates % m.gp_every == 0
            loss_total, distance, penalty = zero.clone(), zero.clone(), zero.clone()
            for i, p in enumerate(prepared):
                b = p.batch
                with ctx.no_sync("critic", last=i == len(prepared) - 1):
                    with ctx.autocast():
                        with torch.no_grad():
                            noise = self._generator_noise(p, ctx.device, rng)
                            fake = generator(b.primaries, b.counts, p.index, *noise).muons
                        fake = fake.float()
                        loss, dist = critic_loss(
                            self._scores(critic, p.real, p), self._scores(critic, fake, p)
                        )
                        if use_gp:
                            cap = gp_pair_cap(m.gp_max_pairs, m.gp_sample_fraction, b.num_muons)
                            pairs = pair_muons(b.counts, b.counts, cap, True, b.num_muons, generator=rng)
                            gp = gradient_penalty(
                                gp_critic, p.real, fake, b.primaries, b.counts, b.counts, pairs,
                                m.critic_output, m.critic_clamp, rng, gp_function,
                            )  # fmt: skip
                            loss = loss + m.lambda_gp * gp
                            penalty = penalty + gp.detach().float() * p.weight
                    ctx.backward(loss * p.weight)
                loss_total = loss_total + loss.detach().float() * p.weight
                distance = distance + dist.detach().float() * p.weight
            ctx.optimizer_step("critic")
        return {"critic_loss": loss_total, "wasserstein": distance, "gradient_penalty": penalty}

    def _likelihood_update(self, prepared: list[_Prepared], ctx: UpdateContext) -> dict[str, torch.Tensor]:
        """model.likelihood_warmup: one generator update on the likelihood alone (the multiplicity's NB and the
        flow head's per-muon density of the real muons): no critic in it, no generated muons."""
        m = self.cfg.model
        generator = ctx.modules["generator"]
        rng = self.rng(ctx.device)
        zero = torch.zeros((), device=ctx.device)
        nll_total, muon_total = zero, zero
        for i, p in enumerate(prepared):
            b = p.batch
            # only the event latents: no muons are generated, so none of the per-muon ones are drawn
            z_global = torch.randn(len(b), m.latent_global, device=ctx.device, generator=rng)
            with ctx.no_sync("generator", last=i == len(prepared) - 1):
                with ctx.autocast():
                    nll, muon_nll = likelihood_losses(
                        generator, b.primaries, b.counts, p.index, b.muons, z_global
                    )
                ctx.backward((m.multiplicity_weight * nll + muon_nll) * p.weight)
            nll_total = nll_total + nll.detach().float() * p.weight
            muon_total = muon_total + muon_nll.detach() * p.weight
        ctx.optimizer_step("generator")
        return {
            "critic_loss": zero, "wasserstein": zero, "gradient_penalty": zero, "generator_loss": zero,
            "multiplicity_nll": nll_total, "muon_nll": muon_total,
        }  # fmt: skip

    def _tune_critic(self, wasserstein: torch.Tensor) -> None:
        """model.adaptive_critic: the next update's critic steps from this one's Wasserstein estimate, averaged
        over ranks (one collective) so that every rank takes the same number of steps."""
        tuning = self.cfg.model.adaptive_critic
        assert tuning is not None
        estimate = float(dist.sum_tensors({"w": wasserstein.detach()})["w"]) / self.env.world_size
        before = self.critic_steps
        if estimate < tuning.lag_below:
            self.critic_steps = min(before + 1, tuning.max_steps)
        elif estimate > tuning.dominate_above:
            self.critic_steps = max(before - 1, tuning.min_steps)
        if self.critic_steps != before and self.env.is_main:
            log.info(
                "adaptive critic: %d -> %d critic steps per update (Wasserstein estimate %.4g, %s)",
                before,
                self.critic_steps,
                estimate,
                "the critic lags" if self.critic_steps > before else "the critic dominates",
            )

    def _generator_update(self, prepared: list[_Prepared], ctx: UpdateContext) -> dict[str, torch.Tensor]:
        m = self.cfg.model
        generator, critic = ctx.modules["generator"], ctx.modules["critic"]
        rng = self.rng(ctx.device)
        zero = torch.zeros((), device=ctx.device)
        adv_total, nll_total, muon_nll_total = zero, zero, zero
        for i, p in enumerate(prepared):
            b = p.batch
            last = i == len(prepared) - 1
            # the critic only passes gradients through here: no all-reduce of its (discarded) gradients
            with ctx.no_sync("generator", last=last), ctx.no_sync("critic", last=False):
                with ctx.autocast():
                    noise = self._generator_noise(p, ctx.device, rng)
                    real = b.muons if m.muon_nll_weight > 0 else None
                    # the encoder's posterior draw for the real muons' density: from the checkpointed stream
                    posterior = None
                    if real is not None and m.latent_encoder:
                        posterior = torch.randn(len(b), m.latent_global, device=ctx.device, generator=rng)
                    out = generator(b.primaries, b.counts, p.index, *noise, real=real, z_posterior=posterior)
                    fake = out.muons
                    adversarial = generator_loss(self._scores(critic, fake.float(), p))
                    nll = MultiplicityHead.nll(out.log_mu.float(), out.log_r.float(), b.counts).mean()
                    loss = adversarial + m.multiplicity_weight * nll
                    if out.real_log_prob is not None:
                        # Flow-GAN: the real muons' likelihood under the generator (per muon, its mean)
                        muon_nll = real_muon_nll(out.real_log_prob, out.latent_kl)
                        loss = loss + m.muon_nll_weight * muon_nll
                        muon_nll_total = muon_nll_total + muon_nll.detach() * p.weight
                ctx.backward(loss * p.weight)
            adv_total = adv_total + adversarial.detach().float() * p.weight
            nll_total = nll_total + nll.detach().float() * p.weight
            if last:
                self._last_fake = fake.detach()
        ctx.zero_grad("critic")
        ctx.optimizer_step("generator")
        out = {"generator_loss": adv_total, "multiplicity_nll": nll_total}
        if m.muon_nll_weight > 0:
            out["muon_nll"] = muon_nll_total
        return out

    # ---- evaluation and histograms ------------------------------------------------------------------------

    def eval_step(self, batch: MuonBatch, ctx: UpdateContext) -> dict[str, torch.Tensor]:
        generator: Generator = ctx.raw_modules["generator"]  # type: ignore[assignment]
        critic = ctx.raw_modules["critic"]
        p = _Prepared(batch, event_index(batch.counts, batch.num_muons), 1.0, generator.scaler(batch.muons))
        rng = torch.Generator(device=ctx.device).manual_seed(EVAL_SEED)
        noise = generator.noise(len(batch), batch.num_muons, ctx.device, rng)
        with ctx.autocast():
            out = generator(batch.primaries, batch.counts, p.index, *noise)
            _, dist = critic_loss(self._scores(critic, p.real, p), self._scores(critic, out.muons.float(), p))
        nll = MultiplicityHead.nll(out.log_mu.float(), out.log_r.float(), batch.counts)
        n = float(len(batch))
        return {
            "multiplicity_nll_sum": nll.sum().double(),
            "wasserstein_sum": dist.double() * n,
            "count": torch.tensor(n, dtype=torch.float64),
        }

    def finish_eval(self, sums: dict[str, float]) -> dict[str, float]:
        count = max(sums.get("count", 1.0), 1.0)
        return {
            "val_multiplicity_nll": sums.get("multiplicity_nll_sum", 0.0) / count,
            "val_wasserstein": sums.get("wasserstein_sum", 0.0) / count,
        }

    def histograms(self, batch: MuonBatch) -> dict[str, torch.Tensor]:
        out = super().histograms(batch)
        fake = self._last_fake
        if fake is not None and fake.shape[0] and self._generator is not None:
            fake = self._generator.scaler.inverse(fake.float())  # normalised units, like the real ones
            out.update(gen_muon_log10E_PeV=fake[:, 0], gen_muon_x=fake[:, 1], gen_muon_y=fake[:, 2])
        if self._generator is not None and len(batch):
            # sampled multiplicities from a forked RNG: logging must not shift the training's random stream
            with _fork_rng(batch.primaries.device):
                counts = self._generator.multiplicity.sample(batch.primaries)
            out["gen_multiplicity_log10"] = torch.log10(counts.float() + 1.0)
        return out

    # ---- the quality table on the validation files at the end (wip/quality; see evaluate.py) -------------

    def after_training(self, modules: dict[str, nn.Module], step: int) -> None:
        """The evaluate table (ours vs floor vs baseline per feature and bin) on data.val_paths, written to
        <run folder>/evaluate_val.json and logged."""
        if self.cfg.data.val_paths:
            evaluate_after_training(self.cfg, modules, step, self.run_dir)
