"""The muon workload's verbs, as the registry takes them (`VERBS`, checked at registration): the task of each
model type, `hpctrain data` (data_verbs.py), `hpctrain sample` and `hpctrain evaluate` (the options each takes and
what it does with the checkpoint the command found), the report and `hpctrain.load(...).sampler`.

Every command imports this module (registration), login nodes included: torch, the tasks, the networks and
the judge are imported inside the callables, when a verb runs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.sections.base import SEED_MAX
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_text, nearest_existing_folder
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.stages import Stages
from hpctrain.workloads.muons.spec import (
    EVALUATE_EVENTS,
    EVALUATE_SEED,
    SAMPLE_BATCH,
    MuonFlowRun,
    MuonMultiplicityRun,
    MuonWGANRun,
)
from hpctrain.workloads.muons.spec import JUDGE_FOLDS as FOLDS
from hpctrain.workloads.muons.spec import JUDGE_NULL_REPLICATES as NULL_REPLICATES
from hpctrain.workloads.registry import DataVerbs, FilesVerb, ModelVerb, Verbs, lazy_data_verbs

if TYPE_CHECKING:
    from hpctrain.track.report.panels import WorkloadReport
    from hpctrain.train.checkpoint import Located
    from hpctrain.train.task import Task


def _check_seed(seed: int) -> None:
    """--seed as run.seed takes it (torch.manual_seed overflowed past int64: a traceback)."""
    if not 0 <= seed <= SEED_MAX:
        raise UserError(f"--seed must be in 0 .. 2**63-1, not {seed}")


def _check_common(args: argparse.Namespace) -> None:
    """--events, --batch-size and --seed, as `sample` and `evaluate` both take them."""
    if args.n_events is not None and args.n_events < 1:
        raise UserError(f"--events must be at least 1, not {args.n_events}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
    _check_seed(args.seed)


def sample_args(parser: argparse.ArgumentParser) -> None:
    """The options of `hpctrain sample` for a muon model."""
    g = parser.add_argument_group("muon models")
    source = g.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--primaries",
        metavar="PATH",
        help="the primaries to generate for: a CSV or Parquet table with named columns energy_GeV, zenith_rad "
        "(radians, 0 = vertical, to pi/2) or cos_zenith, mass_GeV, depth_m; or muon files (file, folder, glob; "
        "any layout) whose primaries to use",
    )
    # --events as in `data inspect` and `data generate --events-per-file` (--n-events, the old name, still works)
    source.add_argument(
        "--events",
        "--n-events",
        dest="n_events",
        type=int,
        help="draw this many primaries from the synthetic truth",
    )
    g.add_argument(
        "--out", required=True, help="output Parquet file (the current layout); not replaced if it exists"
    )
    g.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    g.add_argument("--seed", type=int, default=0, help="seed of the primaries and the generation")
    g.add_argument(
        "--batch-size",
        type=int,
        default=SAMPLE_BATCH,
        help=f"events generated at once (default {SAMPLE_BATCH}; more on a GPU)",
    )
    g.add_argument("--device", default=None, help="cpu, cuda or mps (default: cuda when available)")


def sample(args: argparse.Namespace, found: Located) -> int:
    """Generate muon bundles with a muon_wgan model; writes the current Parquet layout."""
    check_sample(args)

    import torch

    from hpctrain.workloads.muons.models import sampling

    start = time.perf_counter()
    stages = Stages("sample", sys.stdout)
    stages.stage(f"loading the model of {found.file}")
    model = sampling.load_model(args.model, args.device, found)
    torch.manual_seed(args.seed)
    what = f"{args.n_events} events" if args.n_events else f"the events of {args.primaries}"
    stages.stage(f"generating {what} into {args.out}", args.n_events or 0, "events")
    # streamed: primaries, generation and the Parquet writer hold one batch at a time (10M events fit)
    at_cap = [0]  # events whose sampled multiplicity hit the cap

    def counted(chunk: Any) -> Any:
        at_cap[0] += int((chunk.counts >= model.cap).sum())
        return chunk

    generated = (
        counted(chunk)
        for primaries, ids in sampling.primary_chunks(
            args.n_events, args.primaries, args.seed, args.batch_size
        )
        for chunk in sampling.generate_chunks(model, primaries, ids, args.batch_size)
    )
    chunks = stages.counted(generated, len)  # an ETA every 10 s
    events, muons = sampling.write_stream(args.out, chunks)
    print(
        f"wrote {events} events, {muons} muons to {args.out} (model {model.checkpoint}, "
        f"update {model.step}, device {model.device}, {time.perf_counter() - start:.1f} s); "
        + sampling.cap_line(at_cap[0], events, model.cap)
    )
    return 0


def check_sample(args: argparse.Namespace) -> None:
    """`hpctrain sample`'s flags, before the model loads (run_model_verb: before torch's import too)."""
    _check_common(args)
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise UserError(f"--out {args.out} is a folder: name the Parquet file to write")
    if (out.exists() or out.is_symlink()) and not args.overwrite:  # a checkpoint, a data file: kept
        raise UserError(
            f"--out {args.out} exists: nothing was written; choose another file, or add --overwrite to replace it"
        )
    folder = out.absolute().parent
    if not folder.is_dir():  # checked before the model loads: no traceback from the writer after minutes
        raise UserError(
            f"--out {args.out}: no such folder {folder} (nearest existing folder: {nearest_existing_folder(folder)})"
        )


def evaluate_args(parser: argparse.ArgumentParser) -> None:
    """The options of `hpctrain evaluate` for a muon model."""
    g = parser.add_argument_group("muon models")
    g.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="held-out muon files (files, folders, globs, pelican:// URIs; any layout): compare with their "
        "own bundles instead of the synthetic truth (floor: one half of them against the other)",
    )
    g.add_argument(
        "--events",
        "--n-events",
        dest="n_events",
        type=int,
        default=None,
        help=f"truth events to compare (default {EVALUATE_EVENTS}; fewer: a smoke check, not a verdict); with "
        "--data: at most this many held-out events (default all)",
    )
    g.add_argument(
        "--seed", type=int, default=EVALUATE_SEED, help="seed of the truth sample and the generation"
    )
    g.add_argument(
        "--truth",
        default=None,
        metavar="VERSION",
        help="the synthetic truth to judge against, v1 or v2 (default: the version the model's training files "
        "record)",
    )
    g.add_argument(
        "--batch-size",
        type=int,
        default=SAMPLE_BATCH,
        help=f"events generated at once (default {SAMPLE_BATCH}; more on a GPU)",
    )
    g.add_argument("--device", default=None, help="cpu, cuda or mps (default: cuda when available)")
    g.add_argument("--out", help="where to write the JSON (default <run folder>/evaluate.json)")
    classifier_args(g)


def classifier_args(g: argparse._ArgumentGroup) -> None:
    """The classifier two-sample test's options (both forms of `hpctrain evaluate`)."""
    g.add_argument(
        "--folds",
        type=int,
        default=FOLDS,
        help=f"cross-validation folds of the classifier test (default {FOLDS})",
    )
    g.add_argument(
        "--null-replicates",
        type=int,
        default=NULL_REPLICATES,
        help=f"replicates of its null band (truth vs truth, or label swaps on files; default {NULL_REPLICATES})",
    )


def _check_classifier(args: argparse.Namespace) -> None:
    if args.folds < 2:
        raise UserError(f"--folds must be at least 2, not {args.folds}")
    if args.null_replicates < 0:
        raise UserError(f"--null-replicates must be non-negative, not {args.null_replicates}")


def check_evaluate(args: argparse.Namespace) -> None:
    """`hpctrain evaluate`'s flags, before the model loads (run_model_verb: before torch's import too)."""
    _check_common(args)
    _check_classifier(args)
    # NumPy: not on every command's path
    from hpctrain.workloads.muons.truth import versions as truth_versions

    if args.truth:
        truth_versions.get(args.truth)  # an unknown version: one line
    if args.truth and args.data:
        raise UserError(f"--truth {args.truth} with --data: held-out files are their own truth; drop one")


def evaluate(args: argparse.Namespace, found: Located) -> int:
    """A muon model's bundles against fresh samples of the synthetic truth or held-out files: W1 and KS per
    feature and bin of primary energy x zenith, next to the floor and the baseline (quality.py). Writes
    evaluate.json in the run folder, appends the figures to metrics.jsonl and prints the table."""
    check_evaluate(args)

    from hpctrain.workloads.muons.evaluation import evaluate, two_sample
    from hpctrain.workloads.muons.models import sampling
    from hpctrain.workloads.muons.truth import versions as truth_versions

    stages = Stages("evaluate", sys.stdout)
    stages.stage(f"loading the model of {found.file}")
    model = sampling.load_model(args.model, args.device, found)
    data, truth, why = None, args.truth or truth_versions.DEFAULT, "chosen with --truth"
    if not args.data and not args.truth:
        truth, why = truth_versions.training_version(list(model.cfg.data.paths))
    if args.data:
        stages.stage(f"reading the held-out events of {' '.join(args.data)}")
        data = evaluate.held_out_events(model.cfg, args.data, args.n_events or 0)
        if len(data) < 2:
            raise UserError(f"--data {' '.join(args.data)}: {len(data)} event(s) read; need at least 2")
    n_events = args.n_events or EVALUATE_EVENTS
    options = two_sample.Options(args.folds, args.null_replicates)
    result = evaluate.evaluate_model(
        model, n_events, args.seed, args.batch_size, data, options, truth, stages
    )
    stages.done("evaluated")
    info = result["info"]
    head = (
        f"evaluated {model.checkpoint} (update {info['step']}) on {info['events']} events of the "
        f"{info['source']}{'' if args.data else f' ({why})'} (floor from {info['floor_events']} independent "
        "events)"
    )
    judge = (
        f"`hpctrain evaluate {args.model}` ({EVALUATE_EVENTS:,} events of the synthetic truth), or --data FILES "
        f"holding at least {2 * EVALUATE_EVENTS:,} held-out events"
    )
    evaluate.print_summary(result, head, judge)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(evaluate.clean(result), indent=1) + "\n")
    elif model.run_dir is not None:
        out = evaluate.write_outputs(model.run_dir, result)
    else:
        raise UserError(f"{args.model}: not inside a run folder; pass --out FILE for the JSON")
    print(f"wrote {out}")
    return 0


def evaluate_files_args(parser: argparse.ArgumentParser) -> None:
    """The options of `hpctrain evaluate --sample FILES --data FILES` (muon bundles, no model)."""
    g = parser.add_argument_group("muon bundles")
    g.add_argument(
        "--sample",
        nargs="+",
        required=True,
        metavar="PATH",
        help="the bundles to judge (files, folders, globs, pelican:// or osdf:// URIs; any layout), generated for "
        "primaries of --data",
    )
    g.add_argument(
        "--data",
        nargs="+",
        required=True,
        metavar="PATH",
        help="the true bundles (files, folders, globs, pelican:// or osdf:// URIs; any layout); each sample "
        "event is paired with the true event of the same primary",
    )
    g.add_argument("--events", type=int, default=0, help="judge at most this many pairs (default all)")
    g.add_argument(
        "--seed", type=int, default=EVALUATE_SEED, help="seed of the splits, folds and null replicates"
    )
    g.add_argument("--out", help="also write the figures as JSON (evaluate.json's form) to this file")
    classifier_args(g)
    r = parser.add_argument_group(
        "remote files (pelican://, osdf://; the token from BEARER_TOKEN or BEARER_TOKEN_FILE, or --token-file)"
    )
    r.add_argument("--token-file", metavar="FILE", help="bearer token file (data.pelican.token_file)")
    r.add_argument("--ca-file", metavar="FILE", help="CA bundle to trust (data.pelican.ca_file)")
    r.add_argument(
        "--federation-url", metavar="URL", help="federation of host-less URIs (data.pelican.federation_url)"
    )
    r.add_argument(
        "--staging-dir", metavar="DIR", help="where remote files are staged (default: node-local scratch)"
    )


def _pelican_access(args: argparse.Namespace) -> Any:
    """data.pelican from the remote-file options (one line, exit 2, for a bad value)."""
    from pydantic import ValidationError

    from hpctrain.config.remote import PelicanConfig

    given = {"token_file": args.token_file, "ca_file": args.ca_file, "federation_url": args.federation_url}
    try:
        return PelicanConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as err:
        problem = err.errors()[0]
        raise UserError(f"--{str(problem['loc'][0]).replace('_', '-')}: {problem['msg']}") from None


def evaluate_files(args: argparse.Namespace) -> int:
    """A sample from anywhere against true files (evaluation/judge_files.py): prints the tables, --out the
    JSON."""
    if args.events < 0:
        raise UserError(f"--events must be non-negative, not {args.events}")
    _check_seed(args.seed)
    _check_classifier(args)
    out = Path(args.out).expanduser().absolute() if args.out else None
    if out is not None and not out.parent.is_dir():  # checked before the judge's minute
        folder = nearest_existing_folder(out.parent)
        raise UserError(f"--out {args.out}: no such folder {out.parent} (nearest existing folder: {folder})")

    from hpctrain.workloads.muons.evaluation import evaluate, judge_files, two_sample

    options = two_sample.Options(args.folds, args.null_replicates)
    pelican = _pelican_access(args)
    try:
        result = judge_files.judge_files(
            args.sample, args.data, args.events, args.seed, options, pelican, args.staging_dir
        )
    except UserError as err:  # the access settings by the names of this command's options
        message = str(err)
        for key, option in (
            ("data.pelican.ca_file", "--ca-file"),
            ("data.pelican.token_file", "--token-file"),
        ):
            message = message.replace(key, option)
        raise UserError(message) from None
    info = result["info"]
    head = (
        f"judged {info['events']} sample events ({len(info['sample'])} file(s), {', '.join(info['sample_layouts'])}) "
        f"against the true events of the same primaries ({len(info['data'])} file(s), "
        f"{', '.join(info['data_layouts'])}; {info['data_events_unpaired']} without a sample partner left out) "
        f"in {info['seconds']:.1f} s"
    )
    judge = (
        f"the same with at least {2 * EVALUATE_EVENTS:,} paired events (one half is judged against the other)"
    )
    evaluate.print_summary(result, head, judge)
    if out is not None:
        atomic_write_text(out, json.dumps(evaluate.clean(result), indent=1, allow_nan=False) + "\n")
        print(f"wrote {out}")
    return 0


def _data_verbs() -> DataVerbs:
    from hpctrain.workloads.muons.data_verbs import DATA_VERBS

    return DATA_VERBS


def wgan_task(cfg: MuonWGANRun, env: ClusterEnv) -> Task[Any]:
    from hpctrain.workloads.muons.tasks.wgan import MuonWGANTask

    return MuonWGANTask(cfg, env)


def flow_task(cfg: MuonFlowRun, env: ClusterEnv) -> Task[Any]:
    from hpctrain.workloads.muons.tasks.likelihood import MuonFlowTask

    return MuonFlowTask(cfg, env)


def multiplicity_task(cfg: MuonMultiplicityRun, env: ClusterEnv) -> Task[Any]:
    from hpctrain.workloads.muons.tasks.likelihood import MuonMultiplicityTask

    return MuonMultiplicityTask(cfg, env)


def report() -> WorkloadReport:
    from hpctrain.workloads.muons.report import REPORT

    return REPORT


def sampler(trained: Any) -> Any:
    from hpctrain.workloads.muons.models.sampling import Sampler

    return Sampler(trained)


VERBS = Verbs(
    tasks={"muon_wgan": wgan_task, "muon_flow": flow_task, "muon_multiplicity": multiplicity_task},
    data=lazy_data_verbs(_data_verbs),
    sample=ModelVerb(sample_args, sample, check_sample),
    evaluate=ModelVerb(evaluate_args, evaluate, check_evaluate),
    evaluate_files=FilesVerb(evaluate_files_args, evaluate_files),
    report=report,
    sampler=sampler,
)
