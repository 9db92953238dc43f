"""The regression workload's verbs, as the registry takes them (`VERBS`): its one task; no data, sample,
evaluate or report verbs (the generic report draws its run). Every command imports this module (registration),
login nodes included: the task (torch) is imported when one is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.registry import Verbs
from hpctrain.workloads.regression.spec import RegressionRun

if TYPE_CHECKING:
    from hpctrain.train.task import Task


def regression_task(cfg: RegressionRun, env: ClusterEnv) -> Task[Any]:
    from hpctrain.workloads.regression.task import RegressionTask

    return RegressionTask(cfg, env)


VERBS = Verbs(tasks={"regression": regression_task})
