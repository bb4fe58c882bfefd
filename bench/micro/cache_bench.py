"""What one disk-cache put costs as the cache grows, and what keeping the size cap by summing
every entry's size (before .usage) would add to it.

    python -m bench.micro.cache_bench [--sizes 0,1000,5000] [--puts 50] [--entry-kb 20]

For each size the directory is filled with that many entries of --entry-kb, then --puts more
are written and timed (median), and the old way of keeping the cap, a scan that stats every
entry, is timed on the same directory. CPU only. Writes bench/results/cache-<date>.json and
prints a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.paths import RESULTS
from proteus_rewrite.cache import Entry, StorageCache


def median_ms(fn, n: int) -> float:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000.0)
    return round(statistics.median(times), 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,1000,5000", help="entries already in the cache (default 0,1000,5000)")
    ap.add_argument("--puts", type=int, default=50, help="timed puts per size (default 50)")
    ap.add_argument("--entry-kb", type=int, default=20, help="size of each entry (default 20 KiB, a small cubin)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    except ValueError:
        print(f"cache_bench: --sizes {args.sizes!r}: expected comma-separated entry counts", file=sys.stderr)
        return 2
    payload = os.urandom(args.entry_kb * 1024)
    rows = []
    with tempfile.TemporaryDirectory(prefix="proteus-cache-bench-") as tmp:
        store = StorageCache(tmp, max_mb=1 << 20)  # a cap never reached: every put is a plain put
        filled = 0
        for size in sizes:
            while filled < size:
                store.put(Entry(f"{filled:064x}", "cubin", 90, payload))
                filled += 1
            base = 10**9 + size * 10**4
            put = median_ms(lambda i: store.put(Entry(f"{base + i:064x}", "cubin", 90, payload)), args.puts)
            filled += args.puts
            scan = median_ms(lambda i: sum(st.st_size for _, st in store.entries()), max(5, args.puts // 5))
            rows.append({"entries": size, "put_ms": put, "scan_every_entry_ms": scan})
            print(f"{size:>7,} entries: put {put} ms; summing every entry's size {scan} ms", file=sys.stderr)
    doc = {"benchmark": "disk cache put", "date": datetime.date.today().isoformat(),
           "command": "python -m bench.micro.cache_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
           "entry_kb": args.entry_kb, "puts": args.puts, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cache-{doc['date']}.json"
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(doc, indent=1) + "\n")
    tmp_path.replace(path)
    print("| entries | put (ms) | summing every entry's size (ms) |\n|---:|---:|---:|")
    for r in rows:
        print(f"| {r['entries']:,} | {r['put_ms']} | {r['scan_every_entry_ms']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
