"""A warm run's first launches: Python's answers for the launches the app's last run noted, made
before the app launches, so that a kernel's first launch only loads its variants (shim/cuda_warm.c;
PROTEUS_PRELOAD=0 turns it off).

A kernel's first launch in a warm run is a miss: a call into Python to resolve the kernel and
build its key, a disk read, and the driver loading the cubin, on the app's thread; in a short
timed loop that miss is most of what a warm run adds. At exit a run notes which launches its
variants served (their folded arguments, grid and block: a "warm" entry in the disk cache, keyed
by the app's fat binaries). The next run's prestart thread asks for that note (warm_set) for the
fat binaries of the objects loaded with the app and those its runtime registers, and each noted
launch is answered here as its first launch would be (kernel_info, then the miss flow asking the
caches only), while the app is still creating its context. The kernel's first launch then
resolves the kernel with that answer and loads the variants, asking Python nothing; a launch with
other values never matches their keys; a variant the caches no longer hold, or one a speed trial
found slower, is left out. Kernels with device variables are left to their first launch (their
addresses are read from the loaded module), as is every launch of a target that does not load
ahead (HIP).

Why, and why the prestart thread makes no driver call (an earlier form that also loaded the
variants there crashed): docs/dev/findings.md, "Loading a warm run's variants ahead
(PROTEUS_PRELOAD)".
"""

from __future__ import annotations

import os

from ..cache import Entry
from ..errors import CacheError
from ..jit.targets import best_record, target_for
from ..policy import WARM_KIND, WARM_MAX, decode_warm, encode_warm, warm_key
from . import flow, protocol
from .launch import decode_launch
from .report import LaunchRecord
from .session import Session, kernel_info


def _key(session: Session) -> str:
    return warm_key(session.fatbin_digests())


def warm_set(session: Session | None, images: bytes) -> bytes:
    """The launches to load ahead (protocol.WARM_ITEM each) of the fat binaries at `images`
    (protocol.IMAGE_ADDRESS each): those the note of the app's last run lists. Matching the
    images here also spares the first launch hashing its fat binary. `session` None: the run
    time never started (nothing to answer)."""
    try:
        if session is None or session.config.disable or not session.tables:
            return b""
        if "cache-stats" in session.config.trace:  # upstream's cache lines come where the launch meets the cache
            return b""
        if session.warm_note is None:  # read once: later calls are for fat binaries seen since
            disk = session.disk()
            entry = disk.get(_key(session), counted=False) if disk is not None else None
            session.warm_note = entry.data if entry is not None and entry.kind == WARM_KIND else b""
        if not session.warm_note:
            return b""
        fatbins = {}  # sha256 -> (address, table, index); hashed only where there is a note
        for (ptr,) in protocol.IMAGE_ADDRESS.iter_unpack(images):
            match = session.image(ptr)
            if match is not None:
                table, index = match
                if (fatbin := table.fatbin(index)) is not None:
                    fatbins[fatbin.sha256] = (ptr, table, index)
        if not fatbins:
            return b""
        out, infos, answered = [], {}, set()
        for item in decode_warm(session.warm_note):
            if item["fatbin"] not in fatbins:
                continue
            ptr, table, index = fatbins[item["fatbin"]]
            # the record this device's launch resolves to, as kernel_info finds it
            record = best_record([k for k in table.kernels if k.fatbin == index and k.name == item["kernel"]], item["arch"],
                                 session.config.code_kind)
            if record is None or record.globals:
                continue
            args, known = bytearray(sum(p.size for p in record.params)), bytearray(len(record.params))
            offsets, off = [], 0
            for p in record.params:
                offsets.append(off)
                off += p.size
            fits = True
            for index_text, hex_value in item["args"].items():
                i, value = int(index_text), bytes.fromhex(hex_value)
                if i >= len(record.params) or len(value) != record.params[i].size:
                    fits = False  # recorded by another build of the kernel: left to its first launch
                    break
                args[offsets[i]:offsets[i] + len(value)] = value
                known[i] = 1
            if not fits:
                continue
            # what the kernel's first launch would ask, asked now, while the app creates its
            # context: after it, the shim only loads the image. One kernel id per kernel, as its
            # launches would get: the shim loads each noted variant of a kernel only for the id
            # it resolved the kernel with
            if (ptr, record.name) not in infos:
                infos[(ptr, record.name)] = kernel_info(session, ptr, record.name, item["arch"])
            info = infos[(ptr, record.name)]
            if info is None:
                continue
            kid, nparams, dims = protocol.KERNEL_INFO.unpack_from(info)[:3]
            # the launch's key as the shim builds it under this run's policy: noted launches that
            # differ only in what it no longer folds (a learned policy) are one variant, answered once
            fold = info[protocol.KERNEL_INFO.size + 4 * nparams:protocol.KERNEL_INFO.size + 5 * nparams]
            if any(f and not known[i] for i, f in enumerate(fold)):
                continue  # folds what the last run did not note: left to its first launch (as the shim would)
            key = (kid, tuple(bytes(args[offsets[i]:offsets[i] + record.params[i].size]) for i, f in enumerate(fold) if f),
                   tuple(item["block"]) if dims & protocol.DIMS_BLOCK else None, tuple(item["grid"]) if dims & protocol.DIMS_GRID else None)
            if key in answered:
                continue
            answered.add(key)
            launch = decode_launch(session.kernels[kid][1], bytes(args), tuple(item["grid"]), tuple(item["block"]))
            answer = flow.specialize(session, kid, launch, item["arch"], 0.0, protocol.CACHED_AHEAD)
            if not answer:  # not in the caches any more, or found slower: left to the first launch
                continue
            name = record.name.encode()
            out.append(protocol.WARM_ITEM.pack(ptr, *item["grid"], *item["block"], item["arch"], len(record.params), len(name),
                                               len(args), len(info), len(answer))
                       + name + bytes(known) + bytes(args) + info + answer)
        session.trace("variants", f"{len(out)} launch(es) of the last run to load ahead")
        return b"".join(out)
    except Exception as exc:  # never into C: the first launches miss as before
        session.trace("variants", f"reading the last run's variants: {type(exc).__name__}: {exc}")
        return b""


def enabled() -> bool:
    """PROTEUS_PRELOAD, read as the shim reads it (shim/cuda_warm.c): on unless 0, false or no."""
    return os.environ.get("PROTEUS_PRELOAD", "")[:1] not in ("0", "f", "F", "n", "N")


def note(session: Session) -> None:
    """At exit, unless PROTEUS_PRELOAD=0: which launches this run's variants served, for the next
    run to load ahead. Not written when it is what the last run noted (a steady run writes
    nothing); a hint, so the cache's size cap applies to it and a failed write says nothing
    (the variants' own writes have said it)."""
    disk = session.disk()
    if disk is None or not enabled():
        return
    items, seen = [], set()
    for (table, record), stats in zip(session.kernels, session.stats):
        if record.globals or not target_for(record.arch).loads_ahead:
            continue
        sha = fatbin.sha256 if (fatbin := table.fatbin(record.fatbin)) is not None else None
        for v in stats.variants:
            ident = (record.name, v.get("cache_key"))
            if sha is None or ident in seen or "launch" not in v:
                continue
            launch = LaunchRecord.from_json(v["launch"])
            if not target_for(launch.arch).loads_ahead:
                continue
            seen.add(ident)
            # the device's architecture, which the next run's launch resolves the kernel for (the
            # record's may be older: a -fembed-bitcode build's, or a multi-architecture build's)
            items.append({"fatbin": sha, "kernel": record.name, "arch": launch.arch,
                          "args": {str(i): value.hex() for i, value in launch.args},
                          "grid": list(launch.grid), "block": list(launch.block)})
    if not items:
        return
    data = encode_warm(items[:WARM_MAX])
    previous = session.warm_note or None
    if session.warm_note is None:  # not read ahead (no prestart thread): read now
        entry = disk.get(_key(session), counted=False)
        previous = entry.data if entry is not None and entry.kind == WARM_KIND else None
    if data != previous:
        try:
            disk.put(Entry(_key(session), WARM_KIND, 0, data, {"kernel": "(the app's last run's variants)"}))
        except CacheError:
            pass
