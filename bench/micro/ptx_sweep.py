"""Every PTX-route kernel of some nvcc-built files, specialized for one made-up launch and
assembled by ptxas: does the rewrite read real code, and does ptxas take what it writes?

    python -m bench.micro.ptx_sweep FILE... [--sample 150] [--env PROTEUS_X=V ...] [--json OUT.json]

FILE: an executable, a shared library or an `nvcc -c` object. Each kernel recorded with PTX
gets pointers at made-up addresses, integers from a byte pattern, the block of its launch
bounds (else 128) and a grid of 40, and goes through the specializer with ptxas; device
variables get made-up addresses. CPU only, no GPU: it shows the variants assemble, not that
they compute what the originals do (the GPU suites check that). Prints one line per file and
each distinct failure.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import struct
import sys
import time


def launch_for(k):
    from proteus_rewrite.jit.launch import Launch

    args = []
    for p in k.params:
        if p.kind == "pointer":
            args.append((0x7F0000001000 + 256 * p.index).to_bytes(8, "little"))
        elif p.llvm_type == "float":
            args.append(struct.pack("<f", 2.5))
        elif p.llvm_type == "double":
            args.append(struct.pack("<d", 0.25))
        else:
            args.append(bytes((7 + p.index + i) % 256 for i in range(p.size)))
    addresses = {n: 0x7F0000100000 + 4096 * i for i, n in enumerate(k.globals)}
    return Launch(tuple(args), (40, 1, 1), k.max_threads or (128, 1, 1), 90, addresses)


def sweep(path: str, sample: int, settings: dict[str, str] | None = None) -> dict:
    from proteus_rewrite.fatbin import kernels
    from proteus_rewrite.jit import specializer
    from proteus_rewrite.jit.config import Config

    table = kernels.extract(path)
    ptx = [k for k in table.kernels if k.code == "ptx" and k.specializable]
    if sample and len(ptx) > sample:
        ptx = [ptx[i * len(ptx) // sample] for i in range(sample)]
    config = Config.from_env({"PROTEUS_PTX_COMPILER": "ptxas", **(settings or {})})
    failures: collections.Counter = collections.Counter()
    t0 = time.perf_counter()
    ok = 0
    for k in ptx:
        try:
            specializer.specialize(table, k, launch_for(k), config)
            ok += 1
        except Exception as exc:  # noqa: BLE001  every failure is the finding
            failures[f"{type(exc).__name__}: {str(exc)[:300]}"] += 1
    name = os.path.basename(path)
    if name == "main":  # a HeCBench build: its folder names the program
        name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return {"file": name, "kernels": len(table.kernels),
            "ptx_route": sum(1 for k in table.kernels if k.code == "ptx" and k.specializable), "swept": len(ptx),
            "assembled": ok, "failures": dict(failures), "warnings": list(table.warnings[:3]),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--sample", type=int, default=150, help="at most this many kernels a file, evenly spaced (0: all)")
    ap.add_argument("--env", action="append", default=[], metavar="PROTEUS_X=V",
                    help="a setting for the specializer (e.g. PROTEUS_PTX_FOLD_FLOATS=1); repeatable")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    bad = [kv for kv in args.env if not kv.startswith("PROTEUS_") or "=" not in kv]
    if bad:
        ap.error(f"--env {bad[0]!r}: expected PROTEUS_NAME=VALUE")
    settings = dict(kv.split("=", 1) for kv in args.env)
    from proteus_rewrite.errors import ProteusError
    from proteus_rewrite.jit.config import Config

    try:
        Config.from_env({"PROTEUS_PTX_COMPILER": "ptxas", **settings})
    except ProteusError as exc:
        ap.error(f"--env: {exc}")
    results = []
    for f in args.files:
        r = sweep(f, args.sample, settings)
        results.append(r)
        print(f"{r['file']}: {r['kernels']} kernels, {r['ptx_route']} on the PTX route, {r['assembled']} of "
              f"{r['swept']} swept assembled ({r['seconds']} s)")
        for reason, n in r["failures"].items():
            print(f"    {n} x {reason}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 1 if any(r["failures"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
