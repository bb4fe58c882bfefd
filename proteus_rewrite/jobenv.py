"""The job a process runs in, from its environment only: its rank (`rank`), and PROTEUS_REPORT
paths with `%r` and `%p` filled in (`expand_path`). Nothing here calls MPI or a launcher."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Set by the launchers, first match wins: Slurm's srun, Open MPI's mpirun, MPICH/Hydra and Intel
# MPI (PMI), PMIx launchers (prterun, Open MPI 5), MVAPICH2, Flux.
RANK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                  "FLUX_TASK_RANK")


def rank(env: Mapping[str, str] | None = None) -> int | None:
    """The process's rank in its job: the first of RANK_VARIABLES that holds a non-negative
    integer (a variable set to anything else is passed over); None outside a parallel launch."""
    env = os.environ if env is None else env
    for name in RANK_VARIABLES:
        text = (env.get(name) or "").strip()
        if text.isdigit():
            return int(text)
    return None


_FIELD = re.compile(r"%([rp%])")


def expand_path(path: str, env: Mapping[str, str] | None = None, pid: int | None = None) -> str:
    """`path` (PROTEUS_REPORT's value) with `%r` replaced by the rank (by the pid where there is
    no rank), `%p` by the pid and `%%` by `%`; any other `%` is left as it is."""
    pid = os.getpid() if pid is None else pid
    r = rank(env)

    def field(m: re.Match) -> str:
        return {"r": str(r if r is not None else pid), "p": str(pid), "%": "%"}[m.group(1)]

    return _FIELD.sub(field, path)
