"""Speed of the full muon_wgan training step (critic_steps critic updates + one generator update).

    python bench/muon_step.py --device cpu|cuda --batch-size B [--critic-steps 5] [--repeats 5]

Times MuonWGANTask.train_step through the trainer's own UpdateContext on one synthetic-truth batch, for GP off
and for GP every 2 critic updates; prints batches/s, events/s, muons/s and peak memory. On CPU it also times a
straightforward per-event-loop implementation of the same step (same networks, one event at a time) in the same
run: `ratio` = our events/s over the loop's (GP off). For reference it prints the figures published for the
original code. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
import torch

REFERENCE = {
    "batches_per_s": 8.13,
    "events_per_s": 390_000,
    "batch": 48_000,
    "critic_steps": 5,
    "gpu": "A100",
}


def make_batch(events: int, cap: int, seed: int):  # type: ignore[no-untyped-def]
    from hpctrain.workloads.muons.events.batch import MuonBatch
    from hpctrain.workloads.muons.truth import v1 as truth

    rng = np.random.default_rng(seed)
    prims, muons, counts = [], [], []
    have = 0
    while have < events:  # truth events at or under the cap, as the loader would hand them out
        p, m, c = truth.sample(events, rng)
        keep = c <= cap
        prims.append(p[keep])
        muons.append(m[np.repeat(keep, c)])
        counts.append(c[keep])
        have += int(keep.sum())
    p, m, c = np.concatenate(prims), np.concatenate(muons), np.concatenate(counts)
    total = int(c[:events].sum())
    return MuonBatch.from_numpy(p[:events].astype(np.float32), m[:total].astype(np.float32), c[:events])


def build(device: torch.device, critic_steps: int, lambda_gp: float, gp_every: int, cap: int):  # type: ignore[no-untyped-def]
    from hpctrain.config.loading import ConfigRequest, load_config
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.context import Context
    from hpctrain.train.optim import build_optimizer
    from hpctrain.workloads.muons.tasks.wgan import MuonWGANTask
    from hpctrain.workloads.registry import config_model, fill_default_types

    overrides = [
        "model.type=muon_wgan", "data.paths=[unused]", f"data.max_muons_per_event={cap}",
        f"model.critic_steps={critic_steps}", f"model.lambda_gp={lambda_gp}", f"model.gp_every={gp_every}",
        "optim.name=adam", "optim.lr=1e-4", "optim.betas=[0.0, 0.9]", "optim.grad_clip_norm=10.0",
    ]  # fmt: skip
    cfg = load_config(ConfigRequest(None, None, overrides, None), config_model(), {}, fill_default_types)
    torch.manual_seed(0)
    task = MuonWGANTask(cfg, ClusterEnv())
    modules = {k: m.to(device) for k, m in task.build_modules().items()}
    optimizers = {k: build_optimizer(m.parameters(), cfg.optim, cfg.optim.lr) for k, m in modules.items()}
    ctx = Context(device, modules, modules, optimizers, "fp32", cfg.optim.grad_clip_norm)
    return task, ctx


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ours(batch, device, critic_steps, lambda_gp, gp_every, cap, repeats):  # type: ignore[no-untyped-def]
    from hpctrain.train.task import MicroBatch

    task, ctx = build(device, critic_steps, lambda_gp, gp_every, cap)
    micro = [MicroBatch(batch, 1.0, len(batch))]
    task.train_step(micro, ctx)  # warm-up (allocator, first-call costs)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(repeats):
        out = task.train_step(micro, ctx)
    float(out.loss)  # one sync at the end, as when logging
    sync(device)
    return (time.perf_counter() - start) / repeats


def loop_step(task, ctx, batch, critic_steps: int, use_gp: bool) -> None:  # type: ignore[no-untyped-def]
    """The same update written the straightforward way: one event at a time, per-event GP by autograd."""
    from hpctrain.workloads.muons.models.networks import MultiplicityHead

    gen, critic = ctx.raw_modules["generator"], ctx.raw_modules["critic"]
    opt_g, opt_c = ctx.optimizers["generator"], ctx.optimizers["critic"]
    b = len(batch)
    off = batch.offsets.tolist()
    events = []
    for e in range(b):
        n = off[e + 1] - off[e]
        events.append((batch.primaries[e : e + 1], batch.muons[off[e] : off[e + 1]], batch.counts[e : e + 1],
                       torch.zeros(n, dtype=torch.int64, device=batch.muons.device)))  # fmt: skip
    for _ in range(critic_steps):
        opt_c.zero_grad()
        for prim, real, count, idx in events:
            with torch.no_grad():
                fake, _, _ = gen(prim, count, idx)
            loss = (critic(fake, idx, prim, count) - critic(real, idx, prim, count)).sum() / b
            if use_gp and len(real):
                alpha = torch.rand(1, 1)
                x = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
                (g,) = torch.autograd.grad(critic(x, idx, prim, count).sum(), x, create_graph=True)
                loss = loss + 10.0 * (g.norm() - 1) ** 2 / b
            loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 10.0)
        opt_c.step()
    opt_g.zero_grad()
    for prim, _real, count, idx in events:
        fake, log_mu, log_r = gen(prim, count, idx)
        nll = MultiplicityHead.nll(log_mu, log_r, count).sum()
        ((-critic(fake, idx, prim, count).sum() + nll) / b).backward()
    torch.nn.utils.clip_grad_norm_(gen.parameters(), 10.0)
    opt_g.step()


def time_loop(batch, device, critic_steps, cap, repeats, use_gp):  # type: ignore[no-untyped-def]
    task, ctx = build(device, critic_steps, 10.0 if use_gp else 0.0, 2, cap)
    loop_step(task, ctx, batch, critic_steps, use_gp)
    start = time.perf_counter()
    for _ in range(repeats):
        loop_step(task, ctx, batch, critic_steps, use_gp)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-size", type=int, default=None, help="events per batch (cpu 512, cuda 48000)")
    parser.add_argument("--critic-steps", type=int, default=5)
    parser.add_argument(
        "--cap", type=int, default=2000, help="max muons per event (as data.max_muons_per_event)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loop-batch", type=int, default=128, help="events per batch for the per-event loop")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch_size = args.batch_size or (48_000 if args.device == "cuda" else 512)
    raw = make_batch(batch_size, args.cap, seed=0)
    batch = raw.to(device).normalize()
    print(
        f"batch: {len(batch)} events, {batch.num_muons} muons (cap {args.cap}); critic_steps {args.critic_steps}"
    )
    print(
        f"published reference (original code): {REFERENCE['batches_per_s']} batches/s, "
        f"{REFERENCE['events_per_s']:,} events/s at batch {REFERENCE['batch']:,}, critic_steps 5, GP off, one A100"
    )
    result: dict = {
        "device": args.device,
        "batch": len(batch),
        "muons": batch.num_muons,
        "reference": REFERENCE,
    }
    for label, lambda_gp, every in (("gp_off", 0.0, 1), ("gp_every_2", 10.0, 2)):
        seconds = time_ours(batch, device, args.critic_steps, lambda_gp, every, args.cap, args.repeats)
        figures = {
            "batches_per_s": 1 / seconds,
            "events_per_s": len(batch) / seconds,
            "muons_per_s": batch.num_muons / seconds,
        }
        if device.type == "cuda":
            figures["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        else:
            figures["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result[label] = figures
        mem = ", ".join(f"{k} {v:.2f}" for k, v in figures.items() if k.startswith("peak"))
        print(
            f"ours {label:<11}: {figures['batches_per_s']:.3f} batches/s, {figures['events_per_s']:,.0f} events/s, "
            f"{figures['muons_per_s']:,.0f} muons/s, {mem}"
        )
    if device.type == "cuda":
        result["vs_reference_events"] = result["gp_off"]["events_per_s"] / REFERENCE["events_per_s"]
        print(
            f"events/s over the published A100 figure: {result['vs_reference_events']:.2f} (goal on H100: >= 3)"
        )
    else:
        small = make_batch(args.loop_batch, args.cap, seed=1).normalize()
        ours_small = time_ours(small, device, args.critic_steps, 0.0, 1, args.cap, args.repeats)
        loop = time_loop(small, device, args.critic_steps, args.cap, 1, use_gp=False)
        result["loop"] = {
            "batch": len(small),
            "muons": small.num_muons,
            "events_per_s_ours": len(small) / ours_small,
            "events_per_s_loop": len(small) / loop,
        }
        result["ratio"] = loop / ours_small
        print(
            f"per-event loop at batch {len(small)} (GP off): {len(small) / loop:,.0f} events/s vs ours "
            f"{len(small) / ours_small:,.0f} events/s: ratio ours/loop = {result['ratio']:.1f}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
