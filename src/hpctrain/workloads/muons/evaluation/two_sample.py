"""The conditional classifier two-sample test of muon bundles, and FPD/KPD on the same features.

Paired primaries: each primary has one true and one generated bundle. A classifier (gradient-boosted trees)
learns to tell them apart from the event's features (`event_features.py`) next to the primary's parameters;
its k-fold cross-validated AUC (out-of-fold scores, folds split by primary so a pair never straddles two folds)
is 0.5 where the generator is perfect given the primary, and above it where anything in an event's joint
structure, or its dependence on the primary, differs. The AUC's null spread comes from truth-vs-truth
replicates (the same test between two independent truth bundles for the same primaries) where a truth can be
drawn, else (true files from anywhere) from label swaps: the same test with the two bundles of a random half
of the pairs swapped, which under "generated = true given the primary" has exactly the test's distribution
(the pairs are exchangeable), and which no truth sampler is needed for.

FPD (Frechet distance, as FID but on physics features: Kansal et al. 2023, arXiv:2211.10295) and KPD (the
unbiased MMD^2 with the cubic polynomial kernel, as KID: Binkowski et al. 2018) compare the two feature
clouds (events x [features, primary], standardised by the truth's moments) without conditioning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpctrain.track.stages import NO_STAGES, Stages
from hpctrain.workloads.muons.evaluation import event_features
from hpctrain.workloads.muons.events.decoded import Events
from hpctrain.workloads.muons.spec import JUDGE_FOLDS, JUDGE_NULL_REPLICATES

ENERGY_BINS_LOG10_GEV = (3.0, 5.0, 6.0, 7.0, 8.0, 9.0)
FOLDS, NULL_REPLICATES = JUDGE_FOLDS, JUDGE_NULL_REPLICATES  # spec.py says why these
NULL_SIGMAS = 3.0  # the null band reaches at least this many Mann-Whitney standard deviations above 0.5
KPD_BLOCK = 1000
CLASSIFIER_THREADS = 1


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with mid-ranks for ties); nan without both classes."""
    pos, neg = int(labels.sum()), int(len(labels) - labels.sum())
    if pos == 0 or neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # mid-ranks: each run of equal scores gets the mean of its ranks
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    mid = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mid, ends - starts)
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def null_sigma(n_pos: int, n_neg: int) -> float:
    """Standard deviation of the AUC of an uninformative score (Mann-Whitney, no ties)."""
    if n_pos == 0 or n_neg == 0:
        return math.nan
    return math.sqrt((n_pos + n_neg + 1) / (12.0 * n_pos * n_neg))


def _classifier(seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        max_iter=150,
        learning_rate=0.1,
        max_leaf_nodes=31,
        min_samples_leaf=40,
        early_stopping=False,
        random_state=seed,
    )


def out_of_fold_scores(x_true: np.ndarray, x_gen: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """(2 n,) scores for [true rows, generated rows], each from the model of the fold that did not see it;
    row i of both (one primary) is in the same fold."""
    n = len(x_true)
    if n < 2:  # nothing to learn from: an uninformative score (AUC 0.5)
        return np.full(2 * n, 0.5)
    folds = min(folds, n)  # a fold without pairs would leave a model nothing to score
    fold = np.random.default_rng(seed).permutation(n) % folds
    x = np.concatenate([x_true, x_gen])
    y = np.r_[np.ones(n), np.zeros(n)]
    fold2 = np.r_[fold, fold]
    scores = np.empty(2 * n)
    from threadpoolctl import threadpool_limits

    # One OpenMP thread: on a shared machine (2 cores, other jobs) two threads spin-waiting for each other made
    # a fit 10-30x slower than one thread (50 k pairs, 2 folds: 39 s vs 3.5 s wall, load 7)
    with threadpool_limits(CLASSIFIER_THREADS):
        for k in range(folds):
            test = fold2 == k
            model = _classifier(seed + k).fit(x[~test], y[~test])
            scores[test] = model.predict_proba(x[test])[:, 1]
    return scores


def energy_bin(primaries: np.ndarray) -> np.ndarray:
    """(n,) index of each primary's log10(E/GeV) bin in ENERGY_BINS_LOG10_GEV."""
    return np.digitize(np.log10(primaries[:, 0]), ENERGY_BINS_LOG10_GEV[1:-1])


def bin_label(i: int) -> str:
    return f"E{ENERGY_BINS_LOG10_GEV[i]:g}-{ENERGY_BINS_LOG10_GEV[i + 1]:g}"


def classifier_aucs(
    primaries: np.ndarray, feats_true: np.ndarray, feats_gen: np.ndarray, folds: int = FOLDS, seed: int = 0
) -> dict[str, float]:
    """{"all": AUC, bin label: AUC}: the cross-validated AUC overall and per primary-energy bin."""
    prim = event_features.primary_features(primaries)
    scores = out_of_fold_scores(
        np.concatenate([feats_true, prim], axis=1), np.concatenate([feats_gen, prim], axis=1), folds, seed
    )
    n = len(primaries)
    labels = np.r_[np.ones(n), np.zeros(n)]
    bins = np.r_[energy_bin(primaries), energy_bin(primaries)]
    out = {"all": auc(scores, labels)}
    for i in range(len(ENERGY_BINS_LOG10_GEV) - 1):
        sel = bins == i
        out[bin_label(i)] = auc(scores[sel], labels[sel]) if sel.any() else math.nan
    return out


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^1/2) of two (n, d) samples' Gaussian moments."""
    if len(a) < 2 or len(b) < 2:  # no covariance from one event
        return math.nan
    mu_a, mu_b = a.mean(axis=0), b.mean(axis=0)
    s_a, s_b = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    # tr (S_a S_b)^1/2 = sum of sqrt of the eigenvalues of S_a S_b (real, >= 0: similar to a PSD matrix)
    eig = np.linalg.eigvals(s_a @ s_b)
    tr_sqrt = float(np.sqrt(np.clip(eig.real, 0.0, None)).sum())
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a) + np.trace(s_b) - 2.0 * tr_sqrt)


def _cubic(k: np.ndarray) -> np.ndarray:
    """k^3 by two products: `** 3` goes through pow() per element (KPD of 50 k events: 9 s)."""
    return k * k * k


def kernel_distance(a: np.ndarray, b: np.ndarray, block: int = KPD_BLOCK, seed: int = 0) -> float:
    """Unbiased MMD^2 with k(x, y) = (x.y / d + 1)^3, the mean over blocks of `block` rows of each."""
    d = a.shape[1]
    rng = np.random.default_rng(seed)
    a, b = a[rng.permutation(len(a))], b[rng.permutation(len(b))]
    m = min(block, len(a), len(b))
    if m < 2:  # the unbiased estimate needs two events a side
        return math.nan
    values = []
    for start in range(0, min(len(a), len(b)) - m + 1, m):
        x, y = a[start : start + m], b[start : start + m]
        kxx, kyy, kxy = _cubic(x @ x.T / d + 1), _cubic(y @ y.T / d + 1), _cubic(x @ y.T / d + 1)
        off = m * (m - 1)
        values.append(
            (kxx.sum() - np.trace(kxx)) / off + (kyy.sum() - np.trace(kyy)) / off - 2.0 * kxy.mean()
        )
    return float(np.mean(values)) if values else math.nan


@dataclass(frozen=True)
class Options:
    """How the test is run: `folds` of the cross-validation, null `replicates` (truth-vs-truth or swaps)."""

    folds: int = FOLDS
    replicates: int = NULL_REPLICATES


DEFAULT_OPTIONS = Options()


@dataclass
class Judgement:
    """The classifier test's figures: AUC and its null band overall and per energy bin, FPD and KPD."""

    auc: dict[str, float]
    null: list[dict[str, float]] = field(default_factory=list)  # one {"all"|bin: AUC} per replicate
    null_source: str = "truth"  # "truth": truth-vs-truth replicates; "swap": label swaps within pairs
    folds: int = FOLDS
    events: dict[str, int] = field(default_factory=dict)  # "all"|bin -> paired primaries
    fpd: float = math.nan
    kpd: float = math.nan
    fpd_null: float = math.nan
    kpd_null: float = math.nan

    def upper(self, key: str) -> float:
        """Upper edge of the null band: the largest replicate AUC, and at least 0.5 + NULL_SIGMAS sigma."""
        n = self.events.get(key, 0)
        reps = [r[key] for r in self.null if math.isfinite(r.get(key, math.nan))]
        edge = 0.5 + NULL_SIGMAS * null_sigma(n, n) if n else math.nan
        return max([edge, *reps]) if reps or n else math.nan

    def accepted(self, key: str = "all") -> bool:
        """Whether the AUC of `key` is within the null band (a perfect generator is, at the band's rate)."""
        return bool(self.auc[key] <= self.upper(key))

    def table(self) -> list[dict[str, Any]]:
        rows = []
        for key in self.auc:
            reps = [r[key] for r in self.null if math.isfinite(r.get(key, math.nan))]
            rows.append(
                {
                    "bin": key,
                    "events": self.events.get(key, 0),
                    "auc": self.auc[key],
                    "null_mean": float(np.mean(reps)) if reps else math.nan,
                    "null_upper": self.upper(key),
                    "within_null": self.accepted(key) if self.events.get(key, 0) else None,
                }
            )
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "auc": self.auc["all"],
            "auc_null_upper": self.upper("all"),
            "accepted": self.accepted("all"),
            "table": self.table(),
            "fpd": self.fpd,
            "kpd": self.kpd,
            "fpd_null": self.fpd_null,
            "kpd_null": self.kpd_null,
            "null_replicates": len(self.null),
            "null_source": self.null_source,
            "folds": self.folds,
        }

    def metrics(self) -> dict[str, float]:
        """Flat figures for metrics.jsonl and the bench: `auc`, `auc_null_upper`, per bin `auc_E<lo>-<hi>` and
        `auc_null_upper_E<lo>-<hi>`, `fpd`, `kpd` (and their truth-vs-truth or swapped values)."""
        out = {"auc": self.auc["all"], "auc_null_upper": self.upper("all")}
        for key in self.auc:
            if key != "all":
                out[f"auc_{key}"], out[f"auc_null_upper_{key}"] = self.auc[key], self.upper(key)
        out.update({"fpd": self.fpd, "kpd": self.kpd, "fpd_null": self.fpd_null, "kpd_null": self.kpd_null})
        return out


def _cloud(primaries: np.ndarray, feats: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return (np.concatenate([feats, event_features.primary_features(primaries)], axis=1) - mean) / std


def judge(
    primaries: np.ndarray,
    true: tuple[np.ndarray, np.ndarray],
    generated: tuple[np.ndarray, np.ndarray],
    nulls: list[tuple[np.ndarray, np.ndarray]] = (),  # type: ignore[assignment]
    folds: int = FOLDS,
    seed: int = 0,
    swaps: int = 0,
    stages: Stages = NO_STAGES,
) -> Judgement:
    """The test for paired bundles: `true`, `generated` and each of `nulls` (other truth bundles for the
    same primaries) are (muons (M, 3) physical, counts (n,)); the nulls give the band, or, without them,
    `swaps` label-swap replicates do."""
    rng = np.random.default_rng(seed)
    fits = 1 + (len(nulls) or swaps)
    stages.stage(
        f"classifier test: {fits} classifiers of {folds} folds (ours, then the null band's)",
        fits,
        "classifiers",
    )
    f_true = event_features.event_features(*true, rng)
    f_gen = event_features.event_features(*generated, rng)
    bins = energy_bin(primaries)
    events = {"all": len(primaries)}
    events.update({bin_label(i): int((bins == i).sum()) for i in range(len(ENERGY_BINS_LOG10_GEV) - 1)})
    result = Judgement(classifier_aucs(primaries, f_true, f_gen, folds, seed), events=events, folds=folds)
    stages.advance()
    cloud_true = np.concatenate([f_true, event_features.primary_features(primaries)], axis=1)
    mean, std = cloud_true.mean(axis=0), cloud_true.std(axis=0) + 1e-12
    c_true, c_gen = _cloud(primaries, f_true, mean, std), _cloud(primaries, f_gen, mean, std)
    result.fpd, result.kpd = frechet_distance(c_true, c_gen), kernel_distance(c_true, c_gen, seed=seed)
    replicates = [(f_true, event_features.event_features(*other, rng)) for other in nulls]
    if not replicates:
        result.null_source = "swap"
        for _ in range(swaps):
            swap = (rng.random(len(primaries)) < 0.5)[:, None]  # (n, 1): the pairs whose labels swap
            replicates.append((np.where(swap, f_gen, f_true), np.where(swap, f_true, f_gen)))
    for j, (f_a, f_b) in enumerate(replicates):
        result.null.append(classifier_aucs(primaries, f_a, f_b, folds, seed + 1000 * (j + 1)))
        stages.advance()
        if j == 0:
            c_a, c_b = _cloud(primaries, f_a, mean, std), _cloud(primaries, f_b, mean, std)
            result.fpd_null = frechet_distance(c_a, c_b)
            result.kpd_null = kernel_distance(c_a, c_b, seed=seed)
    return result


def judge_events(
    true: Events,
    generated: Events,
    nulls: list[Events] = (),  # type: ignore[assignment]
    folds: int = FOLDS,
    seed: int = 0,
    swaps: int = NULL_REPLICATES,
    stages: Stages = NO_STAGES,
) -> Judgement:
    """`judge` on paired Events: row i of `true`, `generated` and each of `nulls` has the same primary (the
    primaries of `true` are used); without `nulls`, `swaps` label-swap replicates make the band."""
    for other in (generated, *nulls):
        assert len(other) == len(true), "paired events: one bundle of each per primary"
    return judge(
        true.primaries.astype(np.float64),
        (true.muons, true.counts),
        (generated.muons, generated.counts),
        [(n.muons, n.counts) for n in nulls],
        folds,
        seed,
        swaps,
        stages,
    )


# What each column of the classifier test's table means, one line each (as quality_judge.LEGEND).
LEGEND = [
    "bin: the primary's energy, log10(E/GeV) (all: every pair); events (pairs): the primaries paired in it, "
    "each with one true and one generated bundle",
    "AUC: cross-validated area under the ROC curve of a classifier telling each primary's true bundle from the "
    "generated one by per-event features (0.5: it cannot tell them apart; 1: always)",
    f"null band: the AUCs a perfect generator shows; null mean: its replicates' mean; null upper: the largest "
    f"replicate and at least 0.5 + {NULL_SIGMAS:g} Mann-Whitney sigma; above it: DIFFERS",
    "FPD / KPD: Frechet and kernel (MMD, cubic kernel) distances of the standardised per-event feature clouds "
    "(0: identical), beside the same between two true samples (or labels swapped)",
]


def format_table(result: Judgement) -> str:
    """The AUC per bin beside its null band, one line each."""
    return "\n".join(table_lines(result.as_dict()))


def verdict_word(within_null: bool | None, smoke: bool = False) -> str:
    """A bin's word: within null / DIFFERS ("-": no pairs); `smoke` (too few events to pass a model:
    verdict.py) says "smoke ok" where it would say within null."""
    if within_null is None:
        return "-"
    if within_null:
        return "smoke ok" if smoke else "within null"
    return "DIFFERS"


def table_lines(judged: dict[str, Any], smoke: bool = False) -> list[str]:
    """`Judgement.as_dict()` (evaluate.json's "two_sample") as text lines: the AUC per bin beside its null
    band, then FPD and KPD beside their null values; `smoke`: as verdict_word's."""
    null = "truth vs truth" if judged["null_source"] == "truth" else "labels swapped"
    lines = [
        f"classifier two-sample test ({judged['folds']}-fold AUC) vs its null band ({judged['null_replicates']} "
        f"replicate(s), {null}; upper edge at least 0.5 + {NULL_SIGMAS:g} sigma)",
        f"{'bin':<10} {'events':>7} {'AUC':>7} {'null mean':>9} {'null upper':>10}  verdict",
    ]
    for row in judged["table"]:
        verdict = verdict_word(row["within_null"], smoke)
        lines.append(
            f"{row['bin']:<10} {row['events']:>7} {_num(row['auc']):>7.4f} {_num(row['null_mean']):>9.4f} "
            f"{_num(row['null_upper']):>10.4f}  {verdict}"
        )
    lines.append(
        f"FPD {_num(judged['fpd']):.4g} ({null} {_num(judged['fpd_null']):.4g}), "
        f"KPD {_num(judged['kpd']):.4g} ({null} {_num(judged['kpd_null']):.4g})"
    )
    return lines


def _num(value: float | None) -> float:
    """evaluate.json writes NaN as null."""
    return math.nan if value is None else float(value)
